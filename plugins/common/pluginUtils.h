// TensorRT glue helpers: logging through the ILoggerFinder TensorRT hands the library, conversions between
// PluginFieldCollection / Dims and the TensorRT-free veo::Fields / veo::Shape, and owned field storage.
#pragma once

#include "NvInferRuntime.h"
#include "pluginFields.h"

#include <exception>
#include <string>
#include <vector>

namespace veo::plugin
{

void setLoggerFinder(nvinfer1::ILoggerFinder* finder) noexcept;
//! Report through TensorRT's logger when one was handed over, else on stderr.
void logError(std::string const& msg) noexcept;
//! logError(prefix + msg), building the line inside the noexcept call: for enqueue and the allocator, where
//! even a std::string temporary (bad_alloc) must not escape.
void logError(char const* prefix, char const* msg) noexcept;

//! Throws PluginConfigError when the current GPU is older than `minSm` (the spec's min_sm), or when its
//! compute capability cannot be read; called at plugin creation, so an engine never holds a plugin that
//! cannot run on its device.
void requireMinSm(char const* op, int minSm);

//! Runs `body`; any exception becomes a logged error naming op::method and the result `onError`, because
//! plugin methods are noexcept and TensorRT must see a status, never an exception.
template <typename R, typename F>
R guarded(char const* op, char const* method, R onError, F&& body) noexcept
{
    try
    {
        return body();
    }
    catch (std::exception const& e)
    {
        logError(std::string(op) + "::" + method + ": " + e.what());
    }
    catch (...)
    {
        logError(std::string(op) + "::" + method + ": unknown error");
    }
    return onError;
}

Fields toFields(nvinfer1::PluginFieldCollection const* fc);
Shape toShape(nvinfer1::Dims const& dims);
bool isSupportedType(nvinfer1::DataType t);
int toVeoDtype(nvinfer1::DataType t);

//! Fields serialized as a PluginFieldCollection whose data stays alive as long as this object.
class FieldStorage
{
public:
    FieldStorage() = default;
    explicit FieldStorage(Fields const& fields) { assign(fields); }
    FieldStorage(FieldStorage const& other) { assign(other.mFields); }
    FieldStorage& operator=(FieldStorage const& other)
    {
        assign(other.mFields);
        return *this;
    }
    void assign(Fields const& fields);
    nvinfer1::PluginFieldCollection const* collection() const { return &mCollection; }

private:
    Fields mFields;
    std::vector<std::vector<int32_t>> mInts;
    std::vector<std::vector<float>> mFloats;
    std::vector<nvinfer1::PluginField> mPluginFields;
    nvinfer1::PluginFieldCollection mCollection{0, nullptr};
};

//! The attribute list a creator advertises (getFieldNames): names and types from the spec, no data.
class FieldNames
{
public:
    struct Entry
    {
        char const* name;
        bool isFloat;
        bool isList;
    };
    explicit FieldNames(std::vector<Entry> const& entries);
    nvinfer1::PluginFieldCollection const* collection() const { return &mCollection; }

private:
    std::vector<nvinfer1::PluginField> mFields;
    nvinfer1::PluginFieldCollection mCollection{0, nullptr};
};

} // namespace veo::plugin

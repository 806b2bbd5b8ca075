#include "pluginUtils.h"

#include "launchChecks.h"
#include "veoKernelStatus.h"

#include <cstdio>
#include <mutex>

namespace veo::plugin
{
namespace
{
std::mutex gLoggerMutex;
nvinfer1::ILoggerFinder* gLoggerFinder{nullptr};
} // namespace

void setLoggerFinder(nvinfer1::ILoggerFinder* finder) noexcept
{
    std::lock_guard<std::mutex> lock(gLoggerMutex);
    if (gLoggerFinder == nullptr)
    {
        gLoggerFinder = finder;
    }
}

void logError(std::string const& msg) noexcept
{
    try
    {
        nvinfer1::ILogger* logger = nullptr;
        {
            std::lock_guard<std::mutex> lock(gLoggerMutex);
            logger = gLoggerFinder != nullptr ? gLoggerFinder->findLogger() : nullptr;
        }
        std::string const line = "[veo-edge plugins] " + msg;
        if (logger != nullptr)
        {
            logger->log(nvinfer1::ILogger::Severity::kERROR, line.c_str());
        }
        else
        {
            std::fprintf(stderr, "%s\n", line.c_str());
        }
    }
    catch (...) // a logger must never throw out of a noexcept plugin method
    {
    }
}

void logError(char const* prefix, char const* msg) noexcept
{
    try
    {
        logError(std::string(prefix != nullptr ? prefix : "") + (msg != nullptr ? msg : ""));
    }
    catch (...) // no memory for the line: nothing more can be said
    {
    }
}

void requireMinSm(char const* op, int minSm)
{
    int sm = 0;
    if (veoDeviceComputeCapability(&sm) != VEO_KERNEL_OK)
    {
        throw PluginConfigError(std::string(op) + ": " + veoKernelLastError());
    }
    std::string const problem = minSmProblem(op, sm, minSm);
    if (!problem.empty())
    {
        throw PluginConfigError(problem);
    }
}

Fields toFields(nvinfer1::PluginFieldCollection const* fc)
{
    using nvinfer1::PluginFieldType;
    Fields out;
    if (fc == nullptr)
    {
        return out;
    }
    for (int32_t i = 0; i < fc->nbFields; ++i)
    {
        auto const& pf = fc->fields[i];
        Field f;
        f.name = pf.name != nullptr ? pf.name : "";
        for (int32_t j = 0; j < pf.length; ++j)
        {
            switch (pf.type)
            {
            case PluginFieldType::kINT32: f.ints.push_back(static_cast<int32_t const*>(pf.data)[j]); break;
            case PluginFieldType::kINT64: f.ints.push_back(static_cast<int64_t const*>(pf.data)[j]); break;
            case PluginFieldType::kINT16: f.ints.push_back(static_cast<int16_t const*>(pf.data)[j]); break;
            case PluginFieldType::kINT8: f.ints.push_back(static_cast<int8_t const*>(pf.data)[j]); break;
            case PluginFieldType::kFLOAT32:
                f.floats.push_back(static_cast<float const*>(pf.data)[j]);
                f.isFloat = true;
                break;
            case PluginFieldType::kFLOAT64:
                f.floats.push_back(static_cast<double const*>(pf.data)[j]);
                f.isFloat = true;
                break;
            default:
                throw PluginConfigError("attribute '" + f.name + "' has field type "
                    + std::to_string(static_cast<int>(pf.type)) + "; expected an integer or float field");
            }
        }
        out.push_back(std::move(f));
    }
    return out;
}

Shape toShape(nvinfer1::Dims const& dims)
{
    Shape s;
    for (int32_t i = 0; i < dims.nbDims; ++i)
    {
        s.d.push_back(dims.d[i]);
    }
    return s;
}

bool isSupportedType(nvinfer1::DataType t)
{
    return t == nvinfer1::DataType::kFLOAT || t == nvinfer1::DataType::kHALF;
}

int toVeoDtype(nvinfer1::DataType t)
{
    return t == nvinfer1::DataType::kHALF ? VEO_DTYPE_FLOAT16 : VEO_DTYPE_FLOAT32;
}

void FieldStorage::assign(Fields const& fields)
{
    mFields = fields;
    mInts.assign(mFields.size(), {});
    mFloats.assign(mFields.size(), {});
    mPluginFields.clear();
    for (std::size_t i = 0; i < mFields.size(); ++i)
    {
        auto const& f = mFields[i];
        if (f.isFloat)
        {
            mFloats[i].assign(f.floats.begin(), f.floats.end());
            mPluginFields.emplace_back(f.name.c_str(), mFloats[i].data(), nvinfer1::PluginFieldType::kFLOAT32,
                static_cast<int32_t>(mFloats[i].size()));
        }
        else
        {
            for (int64_t v : f.ints)
            {
                mInts[i].push_back(static_cast<int32_t>(v));
            }
            mPluginFields.emplace_back(f.name.c_str(), mInts[i].data(), nvinfer1::PluginFieldType::kINT32,
                static_cast<int32_t>(mInts[i].size()));
        }
    }
    mCollection.nbFields = static_cast<int32_t>(mPluginFields.size());
    mCollection.fields = mPluginFields.data();
}

FieldNames::FieldNames(std::vector<Entry> const& entries)
{
    for (auto const& e : entries)
    {
        mFields.emplace_back(e.name, nullptr,
            e.isFloat ? nvinfer1::PluginFieldType::kFLOAT32 : nvinfer1::PluginFieldType::kINT32, e.isList ? 0 : 1);
    }
    mCollection.nbFields = static_cast<int32_t>(mFields.size());
    mCollection.fields = mFields.data();
}

} // namespace veo::plugin

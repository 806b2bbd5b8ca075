// TensorRT-free plugin attributes: what a PluginFieldCollection carries, as plain C++ values, so that
// parsing and validation against the spec run (and are tested) without TensorRT. The glue converts.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace veo
{

//! A plugin configuration or a shape is invalid; the message says what, got, expected, what to do.
class PluginConfigError : public std::invalid_argument
{
public:
    using std::invalid_argument::invalid_argument;
};

struct Field
{
    std::string name;
    std::vector<int64_t> ints;  //!< integer fields (kINT32 / kINT64), one or more values
    std::vector<double> floats; //!< floating-point fields (kFLOAT32 / kFLOAT64)
    bool isFloat{false};
};

using Fields = std::vector<Field>;

//! Reads typed attributes out of Fields, rejecting unknown names and duplicates.
class FieldReader
{
public:
    FieldReader(Fields const& fields, char const* op, std::vector<std::string> known);
    bool has(char const* name) const;
    //! Integer attribute; `fallback` when absent and not required. Checks [lo, hi].
    int64_t getInt(char const* name, bool required, int64_t fallback, int64_t lo, int64_t hi) const;
    float getFloat(char const* name, bool required, float fallback) const;
    std::vector<int64_t> getInts(char const* name, bool required) const;

private:
    Field const* find(char const* name) const;
    Fields const& mFields;
    std::string mOp;
};

//! Plain dims (TensorRT's Dims without TensorRT); -1 marks a dynamic extent.
struct Shape
{
    std::vector<int64_t> d;
    int64_t operator[](std::size_t i) const { return d.at(i); }
    std::size_t rank() const { return d.size(); }
    std::string str() const;
};

} // namespace veo

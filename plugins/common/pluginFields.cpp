#include "pluginFields.h"

#include <algorithm>
#include <limits>
#include <sstream>

namespace veo
{

FieldReader::FieldReader(Fields const& fields, char const* op, std::vector<std::string> known)
    : mFields(fields)
    , mOp(op)
{
    for (std::size_t i = 0; i < fields.size(); ++i)
    {
        auto const& f = fields[i];
        if (std::find(known.begin(), known.end(), f.name) == known.end())
        {
            std::ostringstream msg;
            msg << mOp << ": unknown attribute '" << f.name << "'; expected one of:";
            for (auto const& k : known)
            {
                msg << " " << k;
            }
            throw PluginConfigError(msg.str());
        }
        for (std::size_t j = 0; j < i; ++j)
        {
            if (fields[j].name == f.name)
            {
                throw PluginConfigError(mOp + ": attribute '" + f.name + "' is given twice; give it once");
            }
        }
    }
}

Field const* FieldReader::find(char const* name) const
{
    for (auto const& f : mFields)
    {
        if (f.name == name)
        {
            return &f;
        }
    }
    return nullptr;
}

bool FieldReader::has(char const* name) const
{
    return find(name) != nullptr;
}

int64_t FieldReader::getInt(char const* name, bool required, int64_t fallback, int64_t lo, int64_t hi) const
{
    Field const* f = find(name);
    if (f == nullptr)
    {
        if (required)
        {
            throw PluginConfigError(mOp + ": required attribute '" + name + "' is missing; set it on the node");
        }
        return fallback;
    }
    if (f->isFloat || f->ints.size() != 1)
    {
        throw PluginConfigError(mOp + ": attribute '" + name + "' must be one integer, got "
            + std::to_string(f->isFloat ? f->floats.size() : f->ints.size()) + (f->isFloat ? " float(s)" : " ints"));
    }
    int64_t const v = f->ints[0];
    if (v < lo || v > hi)
    {
        std::ostringstream msg;
        msg << mOp << ": attribute '" << name << "' is " << v << ", expected ";
        if (hi >= std::numeric_limits<int32_t>::max())
        {
            msg << ">= " << lo;
        }
        else
        {
            msg << "in [" << lo << ", " << hi << "]";
        }
        throw PluginConfigError(msg.str());
    }
    return v;
}

float FieldReader::getFloat(char const* name, bool required, float fallback) const
{
    Field const* f = find(name);
    if (f == nullptr)
    {
        if (required)
        {
            throw PluginConfigError(mOp + ": required attribute '" + name + "' is missing; set it on the node");
        }
        return fallback;
    }
    if (!f->isFloat || f->floats.size() != 1)
    {
        throw PluginConfigError(mOp + ": attribute '" + name + "' must be one float");
    }
    return static_cast<float>(f->floats[0]);
}

std::vector<int64_t> FieldReader::getInts(char const* name, bool required) const
{
    Field const* f = find(name);
    if (f == nullptr)
    {
        if (required)
        {
            throw PluginConfigError(mOp + ": required attribute '" + name + "' is missing; set it on the node");
        }
        return {};
    }
    if (f->isFloat)
    {
        throw PluginConfigError(mOp + ": attribute '" + name + "' must be a list of integers, got floats");
    }
    return f->ints;
}

std::string Shape::str() const
{
    std::ostringstream s;
    s << "(";
    for (std::size_t i = 0; i < d.size(); ++i)
    {
        s << (i ? ", " : "") << d[i];
    }
    s << ")";
    return s.str();
}

} // namespace veo

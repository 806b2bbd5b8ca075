#include "poolAllocatorContract.h"

#include <exception>

namespace veo
{

void* poolAllocateAsync(
    MemPool& pool, std::uint64_t size, std::uint64_t alignment, void* stream, std::string& why) noexcept
{
    try
    {
        why.clear();
        if (size == 0)
        {
            return nullptr;
        }
        // Slices are 256-byte aligned: any power-of-two alignment up to 256 is met.
        if (alignment > MemPool::kALIGNMENT || (alignment & (alignment - 1)) != 0)
        {
            why = "alignment " + std::to_string(alignment)
                + " requested; the pool serves 0 or power-of-two alignments up to 256";
            return nullptr;
        }
        return pool.allocate(static_cast<std::size_t>(size), Stream(stream));
    }
    catch (std::exception const& e)
    {
        try
        {
            why = e.what();
        }
        catch (...) // no memory for the message: the nullptr still says it
        {
        }
    }
    catch (...)
    {
    }
    return nullptr;
}

bool poolDeallocateAsync(MemPool& pool, void* memory, void* stream, std::string& why) noexcept
{
    try
    {
        why.clear();
        pool.free(memory, Stream(stream)); // nullptr memory: a no-op
        return true;
    }
    catch (std::exception const& e)
    {
        try
        {
            why = e.what();
        }
        catch (...)
        {
        }
    }
    catch (...)
    {
    }
    return false;
}

} // namespace veo

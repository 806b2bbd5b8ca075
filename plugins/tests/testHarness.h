// A minimal test harness (no third-party dependency): VEO_TEST(name) registers a test; the binary runs
// the test named in argv[1], or all of them. CMake registers one ctest per name.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace veo::test
{
struct Case
{
    char const* name;
    std::function<void()> fn;
};
inline std::vector<Case>& registry()
{
    static std::vector<Case> r;
    return r;
}
struct Register
{
    Register(char const* name, std::function<void()> fn) { registry().push_back({name, std::move(fn)}); }
};
struct Failure
{
    std::string what;
};
//! Thrown by a test that cannot run here (e.g. no CUDA runtime on the machine): exit code 77, which
//! CMake registers as SKIP_RETURN_CODE, so ctest reports it as skipped, never as passed.
struct Skip
{
    std::string why;
};
constexpr int kSKIP_RETURN_CODE = 77;
inline int runMain(int argc, char** argv)
{
    int failed = 0;
    int ran = 0;
    int skipped = 0;
    for (auto const& c : registry())
    {
        if (argc > 1 && std::string(argv[1]) != c.name)
        {
            continue;
        }
        ++ran;
        try
        {
            c.fn();
            std::printf("[ OK   ] %s\n", c.name);
        }
        catch (Skip const& s)
        {
            ++skipped;
            std::printf("[ SKIP ] %s: %s\n", c.name, s.why.c_str());
        }
        catch (Failure const& f)
        {
            ++failed;
            std::printf("[ FAIL ] %s: %s\n", c.name, f.what.c_str());
        }
        catch (std::exception const& e)
        {
            ++failed;
            std::printf("[ FAIL ] %s: unexpected exception: %s\n", c.name, e.what());
        }
    }
    if (ran == 0)
    {
        std::printf("no test named '%s'\n", argc > 1 ? argv[1] : "");
        return 2;
    }
    if (failed != 0)
    {
        return 1;
    }
    return skipped == ran ? kSKIP_RETURN_CODE : 0;
}
} // namespace veo::test

#define VEO_TEST(name)                                                                                         \
    static void name();                                                                                        \
    static ::veo::test::Register reg_##name(#name, name);                                                      \
    static void name()

#define VEO_CHECK(cond)                                                                                        \
    do                                                                                                         \
    {                                                                                                          \
        if (!(cond))                                                                                           \
        {                                                                                                      \
            std::ostringstream veoMsg;                                                                         \
            veoMsg << __FILE__ << ":" << __LINE__ << ": check failed: " #cond;                                 \
            throw ::veo::test::Failure{veoMsg.str()};                                                          \
        }                                                                                                      \
    } while (0)

#define VEO_CHECK_EQ(a, b)                                                                                     \
    do                                                                                                         \
    {                                                                                                          \
        auto const veoA = (a);                                                                                 \
        auto const veoB = (b);                                                                                 \
        if (!(veoA == veoB))                                                                                   \
        {                                                                                                      \
            std::ostringstream veoMsg;                                                                         \
            veoMsg << __FILE__ << ":" << __LINE__ << ": " #a " == " #b " failed: " << veoA << " vs " << veoB;  \
            throw ::veo::test::Failure{veoMsg.str()};                                                          \
        }                                                                                                      \
    } while (0)

// Expects `stmt` to throw `Exc` whose what() contains `needle`.
#define VEO_CHECK_THROWS(stmt, Exc, needle)                                                                    \
    do                                                                                                         \
    {                                                                                                          \
        bool veoThrew = false;                                                                                 \
        try                                                                                                    \
        {                                                                                                      \
            stmt;                                                                                              \
        }                                                                                                      \
        catch (Exc const& e)                                                                                   \
        {                                                                                                      \
            veoThrew = true;                                                                                   \
            if (std::string(e.what()).find(needle) == std::string::npos)                                       \
            {                                                                                                  \
                throw ::veo::test::Failure{std::string("message '") + e.what() + "' lacks '" + needle + "'"}; \
            }                                                                                                  \
        }                                                                                                      \
        VEO_CHECK(veoThrew);                                                                                   \
    } while (0)

#define VEO_TEST_MAIN()                                                                                        \
    int main(int argc, char** argv)                                                                           \
    {                                                                                                          \
        return ::veo::test::runMain(argc, argv);                                                               \
    }

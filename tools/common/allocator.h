// allocator.h: the name of the allocator a tool binary links, for the tools'
// JSON output. Not API.
//
// Header-only on purpose: SHARDLOCK_WITH_JEMALLOC is defined per tool binary
// (tools/CMakeLists.txt), so the answer is the including binary's.
#pragma once

namespace shardlock::tools {

#ifdef SHARDLOCK_WITH_JEMALLOC
inline constexpr const char* kAllocatorName = "jemalloc";
#else
inline constexpr const char* kAllocatorName = "system";
#endif

}  // namespace shardlock::tools

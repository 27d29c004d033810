# Helpers shared by tests/, bench/ and tools/.
include_guard(GLOBAL)

set(SHARDLOCK_WARNINGS "" CACHE STRING
  "Warning flags for shardlock's own targets (set by the developer presets; never PUBLIC)")
option(SHARDLOCK_JEMALLOC "Link jemalloc into shardlockd, shardlock-bench and the other tools" ON)

# shardlock_apply_warnings(<target>): the preset's warnings, PRIVATE only, on
# C++ sources (some, such as -Wnon-virtual-dtor, mean nothing to C).
function(shardlock_apply_warnings target)
  if(SHARDLOCK_WARNINGS)
    separate_arguments(flags UNIX_COMMAND "${SHARDLOCK_WARNINGS}")
    target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:${flags}>")
  endif()
endfunction()

# shardlock_link_components(<target>): the core library and, once it exists,
# the lease service library.
function(shardlock_link_components target)
  target_link_libraries(${target} PRIVATE shardlock::shardlock)
  if(TARGET shardlock_lease)
    target_link_libraries(${target} PRIVATE shardlock::lease)
  endif()
endfunction()

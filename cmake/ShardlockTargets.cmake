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

# shardlock_installed_archive(<target>): an archive that find_package(shardlock)
# consumers link must hold real object code, whatever compiler they use.
# Under LTO (the release preset) GCC writes slim objects, bytecode only,
# which another compiler's linker cannot read (clang++: "plugin needed to
# handle lto object"). -ffat-lto-objects adds the machine code beside the
# bytecode: shardlock's own executables still link the archive with LTO, a
# consumer without GCC's LTO links the code. Other compilers have no fat
# objects (clang++-14), so there the archive is built without LTO.
function(shardlock_installed_archive target)
  get_target_property(ipo ${target} INTERPROCEDURAL_OPTIMIZATION)
  if(NOT ipo)
    return()
  endif()
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # After CMake's own -fno-fat-lto-objects on the command line, so it wins.
    target_compile_options(${target} PRIVATE -ffat-lto-objects)
  else()
    set_property(TARGET ${target} PROPERTY INTERPROCEDURAL_OPTIMIZATION OFF)
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

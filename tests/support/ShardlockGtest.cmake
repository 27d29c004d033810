# shardlock_add_gtest(): one GoogleTest binary, each of its TESTs one ctest
# test named <binary>.<Suite>.<Test>, so `ctest -R` finds a test by name,
# a failure names the test, and `ctest -j` spreads a long binary over the
# cores.
#
#   shardlock_add_gtest(NAME SOURCES src... [LINK lib...] [LABELS label...]
#                       [TOOLS target...] [RESOURCE_LOCK lock] [TIMEOUT s]
#                       [COST n] [RUN_SERIAL] [GRPC_TSAN]
#                       [REQUIRES target...])
#
#   LINK           libraries besides GoogleTest (gtest, gtest_main, gmock)
#                  and shardlock_test_support, which every binary links.
#   LABELS         each test's labels (the presets and `make check` filter
#                  on them: unit, concurrent, cluster, e2e, sim, ...).
#   TOOLS          tool targets the tests run: each one's path is the macro
#                  SHARDLOCK_TOOL_<TARGET> (upper case), and building the
#                  binary builds them. Without SHARDLOCK_BUILD_TOOLS the
#                  binary is not built.
#   REQUIRES       targets that must exist (optional parts: the C ABI, the
#                  metrics exporter); without them the binary is not built.
#   RESOURCE_LOCK  each test holds it (ctest runs no two holders at once).
#   RUN_SERIAL     each test runs with nothing else beside it.
#   TIMEOUT        per test, in seconds (default 300).
#   COST           ctest starts tests of a higher COST first. Only the order
#                  of a run without cost data (a fresh clone: ctest has no
#                  CTestCostData.txt yet) depends on it; see tests/CMakeLists.txt.
#   GRPC_TSAN      TSan's suppressions for the uninstrumented gRPC and
#                  abseil libraries (tests/cluster/etcd/tsan_grpc.supp), for
#                  tests that load gRPC or start a daemon that does.
#
# Discovery (gtest_discover_tests, DISCOVERY_MODE PRE_TEST) runs each binary
# with --gtest_list_tests when ctest starts and the binary is newer than its
# list, so a build runs no test binary. The properties are set on the list
# of discovered tests by a ctest include file of the binary's own: CMake
# 3.25's gtest_discover_tests(PROPERTIES) cannot carry a list value such as
# LABELS "unit;concurrent".
#
# Each directory that registers tests includes this file (GoogleTest's
# discovery script is a directory variable).
include(GoogleTest)

function(shardlock_add_gtest name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "RUN_SERIAL;GRPC_TSAN"
    "RESOURCE_LOCK;TIMEOUT;COST" "SOURCES;LINK;LABELS;TOOLS;REQUIRES")
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "shardlock_add_gtest(${name}): unknown arguments ${arg_UNPARSED_ARGUMENTS}")
  endif()
  # Every registered source, built or not: tests/CMakeLists.txt checks
  # that no *_test.cc is left out of the lists.
  foreach(source IN LISTS arg_SOURCES)
    get_filename_component(source "${source}" ABSOLUTE)
    set_property(GLOBAL APPEND PROPERTY SHARDLOCK_REGISTERED_TEST_SOURCES "${source}")
  endforeach()
  if(arg_TOOLS AND NOT SHARDLOCK_BUILD_TOOLS)
    return()
  endif()
  foreach(target IN LISTS arg_REQUIRES)
    if(NOT TARGET ${target})
      return()
    endif()
  endforeach()
  if(NOT arg_TIMEOUT)
    set(arg_TIMEOUT 300)
  endif()
  add_executable(${name} ${arg_SOURCES})
  target_link_libraries(${name} PRIVATE ${arg_LINK} shardlock_test_support
    GTest::gtest GTest::gtest_main GTest::gmock)
  # Shared test headers (poll_until.h, lock_conformance.h, support/*.h).
  target_include_directories(${name} PRIVATE "${PROJECT_SOURCE_DIR}/tests")
  target_compile_definitions(${name} PRIVATE
    SHARDLOCK_TEST_DATA_DIR="${PROJECT_SOURCE_DIR}/tests/data")
  foreach(tool IN LISTS arg_TOOLS)
    string(TOUPPER "${tool}" tool_macro)
    target_compile_definitions(${name} PRIVATE SHARDLOCK_TOOL_${tool_macro}="$<TARGET_FILE:${tool}>")
    add_dependencies(${name} ${tool})
  endforeach()
  shardlock_apply_warnings(${name})

  gtest_discover_tests(${name} TEST_PREFIX "${name}." TEST_LIST ${name}_TESTS
    DISCOVERY_MODE PRE_TEST DISCOVERY_TIMEOUT 120)

  # Bracket arguments keep each value whole in the generated file.
  set(properties "TIMEOUT ${arg_TIMEOUT}")
  if(arg_LABELS)
    string(APPEND properties " LABELS [==[${arg_LABELS}]==]")
  endif()
  if(arg_RESOURCE_LOCK)
    string(APPEND properties " RESOURCE_LOCK [==[${arg_RESOURCE_LOCK}]==]")
  endif()
  if(arg_COST)
    string(APPEND properties " COST ${arg_COST}")
  endif()
  if(arg_RUN_SERIAL)
    string(APPEND properties " RUN_SERIAL TRUE")
  endif()
  if(arg_GRPC_TSAN)
    # Under TSan: races TSan reports inside the uninstrumented gRPC and
    # abseil libraries are suppressed (the file says which, and why); the
    # preset's TSAN_OPTIONS are kept. Other builds ignore TSAN_OPTIONS.
    set(supp "${PROJECT_SOURCE_DIR}/tests/cluster/etcd/tsan_grpc.supp")
    string(APPEND properties
      " ENVIRONMENT_MODIFICATION [==[TSAN_OPTIONS=string_append: suppressions=${supp}]==]")
  endif()
  set(file "${CMAKE_CURRENT_BINARY_DIR}/${name}_properties.cmake")
  file(WRITE "${file}"
    "# Generated by shardlock_add_gtest() (tests/support/ShardlockGtest.cmake).\n"
    "if(${name}_TESTS)\n"
    "  set_tests_properties(\${${name}_TESTS} PROPERTIES ${properties})\n"
    "endif()\n")
  # After gtest_discover_tests()'s own include file, which defines the tests.
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${file}")
endfunction()

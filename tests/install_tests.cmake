# The tests of what a build installs and packages. Included from the top
# level whenever the install rules are (SHARDLOCK_INSTALL): they need no test
# framework, so the release preset, which builds no unit tests, runs them
# against the tree it installs. Both install this build tree, which writes
# its install_manifest*.txt: RESOURCE_LOCK keeps them apart.

# find_package_consumer: install this build into a scratch prefix, then
# build and run tests/consumer against it with this build's compiler and
# flags, and with the other of g++ and clang++ where installed. The other
# compiler is skipped under a sanitizer (a GCC ASan archive needs GCC's
# runtime), so it runs in the release and clang presets.
set(shardlock_consumer_extra_compilers)
if(NOT "${CMAKE_CXX_FLAGS} ${CMAKE_EXE_LINKER_FLAGS}" MATCHES "-fsanitize=")
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    find_program(SHARDLOCK_CONSUMER_OTHER_CXX NAMES clang++-14 clang++)
  else()
    find_program(SHARDLOCK_CONSUMER_OTHER_CXX NAMES g++)
  endif()
  if(SHARDLOCK_CONSUMER_OTHER_CXX)
    list(APPEND shardlock_consumer_extra_compilers "${SHARDLOCK_CONSUMER_OTHER_CXX}")
  endif()
endif()
add_test(NAME find_package_consumer
  COMMAND ${CMAKE_COMMAND}
    -DBUILD_DIR=${PROJECT_BINARY_DIR}
    -DSOURCE_DIR=${PROJECT_SOURCE_DIR}/tests/consumer
    -DWORK_DIR=${PROJECT_BINARY_DIR}/tests/consumer
    -DCXX_COMPILER=${CMAKE_CXX_COMPILER}
    "-DCXX_FLAGS=${CMAKE_CXX_FLAGS}"
    "-DLINKER_FLAGS=${CMAKE_EXE_LINKER_FLAGS}"
    -DBUILD_TYPE=${CMAKE_BUILD_TYPE}
    "-DEXTRA_COMPILERS=${shardlock_consumer_extra_compilers}"
    -P ${PROJECT_SOURCE_DIR}/tests/consumer/run_consumer_test.cmake)
set_tests_properties(find_package_consumer PROPERTIES
  TIMEOUT 300 LABELS consumer RESOURCE_LOCK shardlock_install_manifest)

# packaging_test: the install rules (every file under the prefix, each
# component alone) and the Debian packages (packaging/): cpack builds them
# from this tree, the script lists, lints and unpacks them and builds
# tests/consumer against them.
if(SHARDLOCK_BUILD_TOOLS)
  add_test(NAME packaging_test
    COMMAND ${PROJECT_SOURCE_DIR}/tests/packaging_test.sh ${PROJECT_BINARY_DIR})
  set_tests_properties(packaging_test PROPERTIES
    TIMEOUT 600 LABELS package RESOURCE_LOCK shardlock_install_manifest)
endif()

# Run with cmake -P: install BUILD_DIR into a scratch prefix, then configure,
# build and run the consumer project against it twice: the locks alone
# (with only xxhash visible to pkg-config) and with the lease component.
# Both with CXX_COMPILER and this build's flags, then again with each of
# EXTRA_COMPILERS (a list, without flags): a consumer need not use the
# compiler shardlock was built with (an LTO build's archives must hold
# machine code, not only GCC's bytecode).
# With PREFIX instead of BUILD_DIR, builds against what is installed there
# (packaging_test: the unpacked .debs).
file(REMOVE_RECURSE "${WORK_DIR}")
if(PREFIX)
  set(prefix "${PREFIX}")
else()
  set(prefix "${WORK_DIR}/prefix")
endif()

function(run_step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer test step failed (${rc}): ${ARGN}")
  endif()
endfunction()

if(NOT PREFIX)
  run_step(${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")
endif()

# A pkg-config search path with xxhash and nothing else: the locks-only
# consumer must configure without liburing's or libsodium's .pc files.
execute_process(COMMAND pkg-config --variable=pcfiledir libxxhash
  OUTPUT_VARIABLE xxhash_pc_dir OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT EXISTS "${xxhash_pc_dir}/libxxhash.pc")
  message(FATAL_ERROR "consumer test: pkg-config cannot find libxxhash")
endif()
set(locks_only_pc "${WORK_DIR}/pkgconfig-xxhash-only")
file(COPY "${xxhash_pc_dir}/libxxhash.pc" DESTINATION "${locks_only_pc}")

function(build_consumer label compiler cxx_flags linker_flags)
  foreach(variant locks lease)
    set(build "${WORK_DIR}/build-${label}-${variant}")
    if(variant STREQUAL "lease")
      set(env "")
      set(lease ON)
    else()
      set(env ${CMAKE_COMMAND} -E env "PKG_CONFIG_LIBDIR=${locks_only_pc}" PKG_CONFIG_PATH=)
      set(lease OFF)
    endif()
    message(STATUS "consumer test: ${variant}, ${compiler}")
    run_step(${env} ${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${build}"
      -DCONSUMER_LEASE=${lease}
      -DCMAKE_PREFIX_PATH=${prefix}
      -DCMAKE_CXX_COMPILER=${compiler}
      "-DCMAKE_CXX_FLAGS=${cxx_flags}"
      "-DCMAKE_EXE_LINKER_FLAGS=${linker_flags}"
      -DCMAKE_BUILD_TYPE=${BUILD_TYPE})
    run_step(${CMAKE_COMMAND} --build "${build}")
    run_step("${build}/consumer")
  endforeach()
endfunction()

build_consumer(own "${CXX_COMPILER}" "${CXX_FLAGS}" "${LINKER_FLAGS}")
foreach(compiler IN LISTS EXTRA_COMPILERS)
  get_filename_component(name "${compiler}" NAME)
  build_consumer("${name}" "${compiler}" "" "")
endforeach()

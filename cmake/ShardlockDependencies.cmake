# Finds shardlock's dependencies and wraps each in a shardlock::<name>
# imported target. A missing required dependency stops configure with the
# Debian package that provides it. Installed with the package config, so a
# find_package(shardlock) consumer resolves them the same way: xxhash always,
# liburing and libsodium only when it asks for the lease component.
include_guard(GLOBAL)

find_package(Threads REQUIRED)
find_package(PkgConfig QUIET)

# shardlock_require_pkg(<name> <pkg-config module> <debian package>)
function(shardlock_require_pkg name module debian_package)
  if(TARGET shardlock::${name})
    return()
  endif()
  if(NOT PkgConfig_FOUND)
    message(FATAL_ERROR
      "shardlock: pkg-config is needed to find ${module}. "
      "Install it with: apt-get install pkg-config ${debian_package}")
  endif()
  pkg_check_modules(SHARDLOCK_PC_${name} QUIET IMPORTED_TARGET GLOBAL ${module})
  if(NOT SHARDLOCK_PC_${name}_FOUND)
    message(FATAL_ERROR
      "shardlock: required dependency '${module}' not found. "
      "Install the Debian package with: apt-get install ${debian_package} "
      "(or run tools/install-deps.sh)")
  endif()
  add_library(shardlock::${name} INTERFACE IMPORTED GLOBAL)
  target_link_libraries(shardlock::${name} INTERFACE PkgConfig::SHARDLOCK_PC_${name})
endfunction()

# lock_table.h and router.h hash inline, so every consumer needs xxhash.
shardlock_require_pkg(xxhash libxxhash libxxhash-dev)

# The lease service's. The static shardlock::lease archive carries liburing
# and libsodium as link-only dependencies, so a consumer of the lease
# component resolves them too; a consumer of the locks alone never looks.
function(shardlock_find_lease_dependencies)
  shardlock_require_pkg(uring liburing liburing-dev)
  shardlock_require_pkg(sodium libsodium libsodium-dev)
endfunction()

# Everything below is needed to build shardlock itself, not to consume it.
if(SHARDLOCK_CONSUMER)
  return()
endif()

shardlock_find_lease_dependencies()

# shardlock_require_config(<package> <debian package>...): find_package in
# CONFIG mode, or stop configure with the Debian packages that provide it. A
# macro, so the package's variables land where find_package would put them.
macro(shardlock_require_config package)
  find_package(${package} CONFIG QUIET)
  if(NOT ${package}_FOUND)
    string(JOIN " " shardlock_debian_packages ${ARGN})
    message(FATAL_ERROR
      "shardlock: required dependency ${package} not found. Install it with: "
      "apt-get install ${shardlock_debian_packages} (or run tools/install-deps.sh)")
  endif()
endmacro()

if(SHARDLOCK_BUILD_TOOLS OR SHARDLOCK_BUILD_BENCH)
  shardlock_require_pkg(jemalloc jemalloc libjemalloc-dev)
  shardlock_require_config(CLI11 libcli11-dev)
  # shardlockctl's JSON output: always valid JSON, whatever bytes a key holds.
  shardlock_require_config(nlohmann_json nlohmann-json3-dev)
endif()

# shardlockd --metrics (src/metrics/): prometheus-cpp's pull side.
if(SHARDLOCK_BUILD_TOOLS AND NOT TARGET shardlock::prometheus)
  shardlock_require_config(prometheus-cpp prometheus-cpp-dev)
  add_library(shardlock::prometheus INTERFACE IMPORTED GLOBAL)
  target_link_libraries(shardlock::prometheus INTERFACE prometheus-cpp::pull)
endif()

if(SHARDLOCK_BUILD_TESTS)
  shardlock_require_config(GTest libgtest-dev libgmock-dev)
endif()

if(SHARDLOCK_BUILD_BENCH)
  shardlock_require_config(benchmark libbenchmark-dev)

  # Optional peers, measured side by side when present.
  find_package(TBB CONFIG QUIET)
  find_package(absl CONFIG QUIET)
  if(PkgConfig_FOUND)
    pkg_check_modules(SHARDLOCK_PC_ck QUIET IMPORTED_TARGET GLOBAL ck)
  endif()
  # Each is 1 or 0 (pkg_check_modules leaves ck's unset when it finds nothing).
  foreach(peer TBB_FOUND absl_FOUND SHARDLOCK_PC_ck_FOUND)
    if(${peer})
      set(${peer} 1)
    else()
      set(${peer} 0)
    endif()
  endforeach()
  set(SHARDLOCK_HAVE_TBB ${TBB_FOUND})
  set(SHARDLOCK_HAVE_ABSL ${absl_FOUND})
  set(SHARDLOCK_HAVE_CK ${SHARDLOCK_PC_ck_FOUND})
  message(STATUS "shardlock benchmark peers (optional): tbb=${TBB_FOUND} absl=${absl_FOUND} "
                 "ck=${SHARDLOCK_PC_ck_FOUND} (install with tools/install-deps.sh --peers)")
endif()

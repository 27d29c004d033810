# The cluster layer's build dependencies: grpc++, protobuf, protoc and
# grpc_cpp_plugin, and etcd's .proto files. Declares SHARDLOCK_BUILD_CLUSTER
# and sets SHARDLOCK_CLUSTER_ENABLED, which src/ and tests/ test. Not
# installed: nothing a find_package(shardlock) consumer links needs gRPC.
#
# Defines, when enabled:
#   shardlock::grpcpp          grpc++ and libprotobuf (imported, interface)
#   SHARDLOCK_PROTOC           path of protoc
#   SHARDLOCK_GRPC_CPP_PLUGIN  path of grpc_cpp_plugin
#   SHARDLOCK_ETCD_PROTO_DIR   the build tree's copy of etcd's .proto files
include_guard(GLOBAL)

# Debian 12 ships gRPC's CMake package config (libgrpc++-dev), which finds
# Protobuf itself; pkg-config plus find_program is the fallback for systems
# without it.
set(shardlock_grpc_found FALSE)
find_package(gRPC CONFIG QUIET)
if(gRPC_FOUND AND TARGET gRPC::grpc++ AND TARGET protobuf::libprotobuf)
  find_program(SHARDLOCK_PROTOC NAMES protoc)
  find_program(SHARDLOCK_GRPC_CPP_PLUGIN NAMES grpc_cpp_plugin)
  if(SHARDLOCK_PROTOC AND SHARDLOCK_GRPC_CPP_PLUGIN)
    add_library(shardlock::grpcpp INTERFACE IMPORTED GLOBAL)
    target_link_libraries(shardlock::grpcpp INTERFACE gRPC::grpc++ protobuf::libprotobuf)
    set(shardlock_grpc_found TRUE)
  endif()
elseif(PkgConfig_FOUND)
  pkg_check_modules(SHARDLOCK_PC_grpcpp QUIET IMPORTED_TARGET GLOBAL grpc++ protobuf)
  find_program(SHARDLOCK_PROTOC NAMES protoc)
  find_program(SHARDLOCK_GRPC_CPP_PLUGIN NAMES grpc_cpp_plugin)
  if(SHARDLOCK_PC_grpcpp_FOUND AND SHARDLOCK_PROTOC AND SHARDLOCK_GRPC_CPP_PLUGIN)
    add_library(shardlock::grpcpp INTERFACE IMPORTED GLOBAL)
    target_link_libraries(shardlock::grpcpp INTERFACE PkgConfig::SHARDLOCK_PC_grpcpp)
    set(shardlock_grpc_found TRUE)
  endif()
endif()

# Whether the option was given (-D) or defaulted, remembered across
# reconfigures: only a defaulted option turns itself off when etcd's protos
# cannot be had.
if(NOT DEFINED CACHE{SHARDLOCK_BUILD_CLUSTER})
  set(SHARDLOCK_BUILD_CLUSTER_DEFAULTED TRUE CACHE INTERNAL "")
endif()
if(PROJECT_IS_TOP_LEVEL AND shardlock_grpc_found)
  set(shardlock_cluster_default ON)
else()
  set(shardlock_cluster_default OFF)
endif()
option(SHARDLOCK_BUILD_CLUSTER
  "Build the cluster layer (the etcd v3 client over grpc++; needs libgrpc++-dev and protobuf-compiler-grpc)"
  ${shardlock_cluster_default})

set(SHARDLOCK_CLUSTER_ENABLED OFF)
if(SHARDLOCK_BUILD_CLUSTER)
  if(NOT shardlock_grpc_found)
    message(FATAL_ERROR
      "shardlock: SHARDLOCK_BUILD_CLUSTER needs grpc++, protobuf, protoc and grpc_cpp_plugin. "
      "Install them with: apt-get install libgrpc++-dev libprotobuf-dev protobuf-compiler "
      "protobuf-compiler-grpc (or run tools/install-deps.sh), or configure with "
      "-DSHARDLOCK_BUILD_CLUSTER=OFF")
  endif()
  # Configure time, into the build tree: the generated sources depend on
  # these files, so they must exist before the build graph is written.
  set(SHARDLOCK_ETCD_PROTO_DIR "${CMAKE_BINARY_DIR}/etcd-protos")
  execute_process(
    COMMAND "${PROJECT_SOURCE_DIR}/tools/fetch-etcd-protos.sh" "${SHARDLOCK_ETCD_PROTO_DIR}"
    RESULT_VARIABLE shardlock_fetch_result
    ERROR_VARIABLE shardlock_fetch_output)
  if(shardlock_fetch_result EQUAL 0)
    set(SHARDLOCK_CLUSTER_ENABLED ON)
  elseif(NOT SHARDLOCK_BUILD_CLUSTER_DEFAULTED)
    message(FATAL_ERROR
      "shardlock: could not fetch etcd's .proto files:\n${shardlock_fetch_output}")
  else()
    message(WARNING
      "shardlock: the cluster layer is off this time: could not fetch etcd's .proto files:\n"
      "${shardlock_fetch_output}")
  endif()
endif()
message(STATUS "shardlock cluster layer (etcd client): ${SHARDLOCK_CLUSTER_ENABLED}")

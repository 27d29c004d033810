# The cluster layer's build dependencies: grpc++, protobuf, protoc and
# grpc_cpp_plugin, and etcd's .proto files. Declares SHARDLOCK_BUILD_CLUSTER
# and sets SHARDLOCK_CLUSTER_ENABLED, which src/ and tests/ test. Not
# installed: nothing a find_package(shardlock) consumer links needs gRPC.
#
# Defines, when enabled:
#   shardlock::grpcpp          grpc++ and libprotobuf (imported, interface)
#   OpenSSL::Crypto            libcrypto, which gRPC's TLS runs on: the etcd
#                              client reads its TLS files with it
#   SHARDLOCK_PROTOC           path of protoc
#   SHARDLOCK_GRPC_CPP_PLUGIN  path of grpc_cpp_plugin
#   SHARDLOCK_ETCD_PROTO_DIR   etcd's .proto files, put there by
#                              tools/install-deps.sh (never by configure)
include_guard(GLOBAL)

# A failed search is never remembered: find_package and find_program cache
# NOTFOUND, and a build tree configured before gRPC was installed would
# otherwise keep the cluster layer off for good. Only NOTFOUND is dropped; a
# path the user or an earlier configure found stays.
foreach(var IN ITEMS gRPC_DIR SHARDLOCK_PROTOC SHARDLOCK_GRPC_CPP_PLUGIN)
  if(DEFINED CACHE{${var}} AND NOT ${var})
    unset(${var} CACHE)
  endif()
endforeach()

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

# AUTO (the default): on when shardlock is the top-level project and gRPC is
# found, decided again at every configure. ON: gRPC missing fails configure
# (the release preset: the daemon users get must have the cluster). OFF: no
# cluster layer; shardlockd --cluster then says it was built without it.
set(SHARDLOCK_BUILD_CLUSTER AUTO CACHE STRING
  "Build the cluster layer (the etcd v3 client over grpc++): AUTO, ON or OFF")
set_property(CACHE SHARDLOCK_BUILD_CLUSTER PROPERTY TYPE STRING)
set_property(CACHE SHARDLOCK_BUILD_CLUSTER PROPERTY STRINGS AUTO ON OFF)
# Build trees configured before AUTO existed cached the defaulted option's
# value (OFF where gRPC was missing then): back to AUTO.
if(SHARDLOCK_BUILD_CLUSTER_DEFAULTED)
  set_property(CACHE SHARDLOCK_BUILD_CLUSTER PROPERTY VALUE AUTO)
  unset(SHARDLOCK_BUILD_CLUSTER_DEFAULTED CACHE)
endif()
string(TOUPPER "${SHARDLOCK_BUILD_CLUSTER}" shardlock_cluster_mode)
if(NOT shardlock_cluster_mode MATCHES "^(AUTO|ON|OFF|TRUE|FALSE|YES|NO|1|0)$")
  message(FATAL_ERROR
    "shardlock: SHARDLOCK_BUILD_CLUSTER is '${SHARDLOCK_BUILD_CLUSTER}'; give AUTO, ON or OFF")
endif()
if(shardlock_cluster_mode STREQUAL "AUTO")
  set(shardlock_cluster_wanted ${shardlock_grpc_found})
  if(NOT PROJECT_IS_TOP_LEVEL)
    set(shardlock_cluster_wanted FALSE)
  endif()
elseif(SHARDLOCK_BUILD_CLUSTER)
  set(shardlock_cluster_wanted TRUE)
else()
  set(shardlock_cluster_wanted FALSE)
endif()

set(shardlock_cluster_reason "")
if(shardlock_cluster_mode STREQUAL "AUTO" AND NOT shardlock_grpc_found)
  set(shardlock_cluster_reason " (gRPC not found; tools/install-deps.sh --release installs it)")
endif()

# Put there by tools/install-deps.sh (tools/fetch-etcd-protos.sh), outside
# the build tree, so that a rebuild or a fresh build tree needs no network.
set(SHARDLOCK_ETCD_PROTO_DIR "${PROJECT_SOURCE_DIR}/.deps/etcd-protos" CACHE PATH
  "etcd's .proto files (tools/fetch-etcd-protos.sh DIR puts them there)")

set(SHARDLOCK_CLUSTER_ENABLED OFF)
if(shardlock_cluster_wanted)
  if(NOT shardlock_grpc_found)
    message(FATAL_ERROR
      "shardlock: SHARDLOCK_BUILD_CLUSTER needs grpc++, protobuf, protoc and grpc_cpp_plugin. "
      "Install them with: tools/install-deps.sh --release (or apt-get install libgrpc++-dev "
      "libprotobuf-dev protobuf-compiler protobuf-compiler-grpc), or configure with "
      "-DSHARDLOCK_BUILD_CLUSTER=OFF")
  endif()
  # The generated sources depend on these files, so they must exist before
  # the build graph is written. Configure only reads them: fetching is a
  # dependency-install step (it needs apt and the network).
  foreach(proto IN ITEMS etcd/etcdserver/etcdserverpb/rpc.proto etcd/mvcc/mvccpb/kv.proto
                         etcd/auth/authpb/auth.proto gogoproto/gogo.proto
                         google/api/annotations.proto google/api/http.proto)
    if(NOT EXISTS "${SHARDLOCK_ETCD_PROTO_DIR}/${proto}")
      message(FATAL_ERROR
        "shardlock: etcd's .proto files are not in ${SHARDLOCK_ETCD_PROTO_DIR} "
        "(${proto} is missing). Fetch them once with:\n"
        "  tools/install-deps.sh --release\n"
        "or only the files, without root:\n"
        "  tools/fetch-etcd-protos.sh ${SHARDLOCK_ETCD_PROTO_DIR}\n"
        "or configure with -DSHARDLOCK_BUILD_CLUSTER=OFF (shardlockd without --cluster).")
    endif()
  endforeach()
  # The etcd client checks its TLS files (PEM, the key against the
  # certificate, the certificate's dates) with the libcrypto gRPC links:
  # libssl-dev, which libgrpc-dev depends on.
  find_package(OpenSSL COMPONENTS Crypto)
  if(NOT TARGET OpenSSL::Crypto)
    message(FATAL_ERROR
      "shardlock: SHARDLOCK_BUILD_CLUSTER needs OpenSSL's libcrypto (apt-get install libssl-dev, "
      "or tools/install-deps.sh --release)")
  endif()
  set(SHARDLOCK_CLUSTER_ENABLED ON)
endif()
message(STATUS
  "shardlock cluster layer (etcd client): ${SHARDLOCK_CLUSTER_ENABLED}${shardlock_cluster_reason}")

# shardlock: the two commands are `make run` and `make test`. Each installs
# the missing Debian packages first (tools/install-deps.sh), then configures
# and builds through the CMake presets in CMakePresets.json.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
JOBS ?= $(shell nproc)
CMAKE ?= cmake
CTEST ?= ctest

.PHONY: all deps deps-release deps-peers deps-cluster deps-failover run test check test-dev test-tsan test-clang bench bench-redis \
        build-release build-bench format lint clean help torture torture-cluster simulate package bench-cluster bench-failover bench-peers bench-security deps-lock-peers

all: build-release

help:
	@echo "make run        build the release preset and run the main job (shardlock-bench)"
	@echo "make test       dev (ASan+UBSan) tests, tsan concurrent tests, clang thread-safety build + fuzz"
	@echo "make check      the quick loop: dev build, unit tests that start no daemon (not a substitute for make test)"
	@echo "make bench      run the lock, lock-table, router and lease-path benchmarks (bench preset)"
	@echo "make bench-redis  shardlock-bench side by side with redis-server on loopback"
	@echo "make bench-cluster  the cluster numbers: 1 vs 3 nodes, replication's cost, etcd requests, kill -9 window"
	@echo "make bench-failover kill -9 of one of 3 servers: shardlock --replicas 2 beside etcd and ZooKeeper"
	@echo "make bench-peers    shardlock beside Redis's lock recipe and etcd's Go Mutex, at equal batching"
	@echo "make bench-security what sealing costs: keyless, --auth, --tenant, --tenant --encrypt (each cipher suite) at --pack 1"
	@echo "make torture    the long fault-injection run (release build): >= 1M lease operations"
	@echo "make torture-cluster  the long cluster run: etcd + 3 nodes, node and etcd faults"
	@echo "make simulate SEEDS=N  the deterministic cluster simulation over N seeds (docs/simulation.md)"
	@echo "make format     clang-format every source file in place"
	@echo "make lint       clang-tidy over src/ and tools/ (part of make test's clang stage)"
	@echo "make package    the Debian packages (release build): build/release/{shardlockd,shardlock-tools,libshardlock-dev,libshardlock-c1}_*.deb"

deps:
	@tools/install-deps.sh

# The release build needs neither the test tools nor the benchmark peers;
# CMake measures the peers only where they are installed. It does need the
# cluster layer's gRPC and etcd's .proto files: the release preset builds
# shardlockd --cluster, and configure never fetches anything itself.
deps-release:
	@tools/install-deps.sh --release

# etcd itself, for the runs that start a real cluster on loopback.
deps-cluster:
	@tools/install-deps.sh --cluster

# etcd, ZooKeeper and kazoo, for make bench-failover.
deps-failover:
	@tools/install-deps.sh --failover

deps-peers:
	@tools/install-deps.sh --peers

deps-lock-peers:
	@tools/install-deps.sh --lock-peers

# ---- the main job --------------------------------------------------------
build-release: deps-release
	$(CMAKE) --preset release >/dev/null
	$(CMAKE) --build --preset release -j $(JOBS)

# The .debs (packaging/): shardlockd (daemon, unit, flags file, docs),
# shardlock-tools, libshardlock-dev (headers, archives, CMake package, .pc)
# and libshardlock-c1. Needs dpkg-shlibdeps (dpkg-dev) for their Depends
# lines; packaging_test (ctest -R packaging in build/release) lints them.
package: build-release
	cd build/release && cpack -G DEB

run: build-release
	@if [ -x build/release/tools/shardlock-bench ]; then \
	  build/release/tools/shardlock-bench; \
	else \
	  build/release/bench/locks_benchmark --benchmark_min_time=0.2; \
	fi

# ---- tests ---------------------------------------------------------------
test: test-dev test-tsan test-clang
	@echo "make test: dev, tsan and clang stages passed"

# Each stage prints how long it took (README, "Testing").
STAGE_CLOCK = start=$$(date +%s); trap 'echo "$@: $$(( $$(date +%s) - start )) s"' EXIT;

test-dev: deps
	@$(STAGE_CLOCK) set -e; \
	$(CMAKE) --preset dev >/dev/null; \
	$(CMAKE) --build --preset dev -j $(JOBS); \
	$(CTEST) --preset dev

test-tsan: deps
	@$(STAGE_CLOCK) set -e; \
	$(CMAKE) --preset tsan >/dev/null; \
	$(CMAKE) --build --preset tsan -j $(JOBS); \
	$(CTEST) --preset tsan

test-clang: deps
	@$(STAGE_CLOCK) set -e; \
	$(CMAKE) --preset clang >/dev/null; \
	$(CMAKE) --build --preset clang -j $(JOBS); \
	$(CTEST) --preset clang; \
	$(LINT)

# The quick loop: the dev build and its unit tests that start no daemon,
# no etcd and no child process (the library, the codec, the server's
# state machine, the checker, the simulation's replay). Not a substitute
# for make test.
CHECK_EXCLUDE = ^(shardlockctl|shardlockd|shardlock_bench|router_tool|cluster_client)_test\.
check: deps
	@$(STAGE_CLOCK) set -e; \
	$(CMAKE) --preset dev >/dev/null; \
	$(CMAKE) --build --preset dev -j $(JOBS); \
	$(CTEST) --preset dev -L unit -LE 'cluster|e2e|torture|sim|python|java|package|consumer' \
	  -E '$(CHECK_EXCLUDE)' -j $(JOBS)

# ---- benchmarks ----------------------------------------------------------
build-bench: deps-peers
	$(CMAKE) --preset bench >/dev/null
	$(CMAKE) --build --preset bench -j $(JOBS)

bench: build-bench
	build/bench/bench/locks_benchmark
	@if [ -x build/bench/bench/lock_table_benchmark ]; then build/bench/bench/lock_table_benchmark; fi
	@if [ -x build/bench/bench/router_benchmark ]; then build/bench/bench/router_benchmark; fi
	@if [ -x build/bench/bench/lease_benchmark ]; then build/bench/bench/lease_benchmark; fi

bench-redis: build-release
	@tools/install-deps.sh --redis
	bench/redis_side_by_side.sh build/release/tools/shardlock-bench

# The cluster's numbers: throughput at 1 and 3 nodes, etcd requests, the
# unavailability window after kill -9 (real etcd on loopback).
bench-cluster: build-release deps-cluster
	bench/cluster_numbers.sh build/release

# Failover side by side: a lock held while one of three servers
# is killed with -9, 5 trials each: does the holder keep it, and how soon
# does a new client's acquire+release work (shardlock --replicas 2, a
# 3-member etcd, a 3-server ZooKeeper; all on loopback).
bench-failover: build-release deps-failover
	bench/failover_numbers.sh build/release

# shardlock beside Redis's lock recipe (unpipelined and -P 16) and etcd's Go
# concurrency.Mutex, each row at equal batching.
bench-peers: build-release deps-lock-peers
	bench/peers_numbers.sh build/release

# What sealing costs a lease at one request per datagram: keyless, the shared
# key, a tenant, an encrypted tenant, alternating in one run (issue 36's goals).
bench-security: build-release
	bench/security_numbers.sh build/release
	bench/tenant_reload.sh build/release

# ---- the long torture run -------------------------------------------------
# 20% loss, duplicates and reordering; kill -9 restarts; server and client
# pauses longer than the max TTL. The short run is part of `make test`.
TORTURE_FLAGS ?= --seconds 420 --workers 8 --clients 8 --keys 64 --loss 0.2 --duplicate 0.2 \
                 --reorder 0.2 --delay 0.1 --kills 5 --server-pauses 2 --client-pauses 6 --seed 2026
torture: build-release
	build/release/tools/shardlock-torture $(TORTURE_FLAGS)

# The long cluster run (docs/cluster.md, "Torture: cluster mode"): etcd and 3
# nodes, 10% loss, duplicates and reordering; kill -9 restarts, pauses past
# the etcd lease, a node joining and leaving, drains, node <-> etcd and
# clients <-> node partitions; and the faults shorter than the etcd lease or
# overlapping: short pauses and etcd partitions, a node stalled across two
# drains (a node that skips a map), double drains, a join during a drain, a kill
# during a hand-off, a rolling restart raising --max-ttl, a slowed map
# watch. A max TTL of 2 s and an etcd lease of 3 s give the stalled double
# drain room to find a skipped map's two holders. Replicated: every node runs
# --replicas 2, node-to-node partitions past the replica timeout and kills
# of a node whose peers stopped hearing it; 2% of the exclusive holders stay
# 1.5 x max TTL, so the kept property has leases that live through a fault.
# The replication faults too: one-way node-to-node cuts, a slow etcd link on one
# node, clients that retransmit slowly, and a node replaced at its address
# under a new id.
# The short runs are ctests (torture_cluster_short,
# torture_cluster_replicated_short).
TORTURE_CLUSTER_FLAGS ?= --cluster-nodes 3 --replicas 2 --seconds 300 --workers 6 --clients 6 \
                         --keys 64 --max-ttl-ms 2000 --etcd-lease-ttl 3 \
                         --node-partitions 3 --kills-mid-replication 2 --stall-per-million 20000 \
                         --loss 0.1 --duplicate 0.1 --reorder 0.1 --delay 0.1 --kills 2 \
                         --server-pauses 2 --client-pauses 3 --joins 1 --drains 1 \
                         --etcd-partitions 2 --client-partitions 2 --short-pauses 3 \
                         --short-etcd-partitions 3 --stalled-double-drains 4 --double-drains 2 \
                         --joins-during-drains 2 --kills-during-handoffs 2 --rolling-restarts 1 \
                         --slow-watches 2 --one-way-node-cuts 2 --slow-etcd-links 2 \
                         --node-replacements 1 --slow-retransmit-groups 1 --seed 2026
torture-cluster: build-release deps-cluster
	build/release/tools/shardlock-torture $(TORTURE_CLUSTER_FLAGS)

# The long run of the deterministic cluster simulation (docs/simulation.md):
# SEEDS seeds from FIRST_SEED, release build; a failing seed replays with
# build/release/tests/sim/shardlock-sim --seed S --trace.
SEEDS ?= 10000
FIRST_SEED ?= 1
simulate: deps-release
	$(CMAKE) --preset release >/dev/null
	$(CMAKE) --build --preset release -j $(JOBS) --target shardlock_sim_tool
	build/release/tests/sim/shardlock-sim --first-seed $(FIRST_SEED) --seeds $(SEEDS)

# ---- house tooling -------------------------------------------------------
SOURCES = $(shell git ls-files '*.h' '*.cc')

format:
	clang-format -i $(SOURCES)

# clang-tidy (.clang-tidy's checks) over the library and the tools, src/ and
# tools/, with the headers they include from include/shardlock/ and
# tools/common/; any warning fails it. Tests and benchmarks are left out to
# keep it within a few minutes on 2 cores. It reads the clang preset's
# compile_commands.json: clang's own flags, nothing for clang-tidy to guess.
# tools/clang-tidy-cached.py skips a file whose preprocessed text, flags and
# checks equal those of an earlier clean run (ccache's idea; the cache is in
# ~/.cache/shardlock-clang-tidy, SHARDLOCK_TIDY_CACHE=off checks them all).
LINT_SOURCES = $(filter src/% tools/%,$(filter %.cc,$(SOURCES)))
# src/cluster/etcd/ includes headers generated at build time (etcd's gRPC stubs):
# they are built first when the cluster layer is configured in.
LINT = if $(CMAKE) --build --preset clang --target help 2>/dev/null | grep -q '^shardlock_etcdpb:'; then \
         $(CMAKE) --build --preset clang --target shardlock_etcdpb -j $(JOBS) >/dev/null; \
       fi; \
       tools/clang-tidy-cached.py -j $(JOBS) -p build/clang $(LINT_SOURCES)

lint: deps
	$(CMAKE) --preset clang >/dev/null
	$(LINT)

clean:
	rm -rf build

// Clang thread-safety analysis attributes, spelled SHARDLOCK_*.
//
// Every lock type in shardlock is a capability, and every guard is a scoped
// capability, so `clang -Wthread-safety` (the `clang` preset) checks callers
// that annotate their data with SHARDLOCK_GUARDED_BY. On compilers without
// the attributes (GCC) each macro expands to nothing.
//
// Not API: include it through the lock headers.
#pragma once

#if defined(__clang__) && defined(__has_attribute)
#define SHARDLOCK_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define SHARDLOCK_THREAD_ANNOTATION_(x)
#endif

// A type whose instances are locks ("mutex" is the analysis' name for it).
#define SHARDLOCK_CAPABILITY(name) SHARDLOCK_THREAD_ANNOTATION_(capability(name))
// An RAII type that holds a capability for its lifetime.
#define SHARDLOCK_SCOPED_CAPABILITY SHARDLOCK_THREAD_ANNOTATION_(scoped_lockable)
// Data that may only be touched while holding the given capability.
#define SHARDLOCK_GUARDED_BY(x) SHARDLOCK_THREAD_ANNOTATION_(guarded_by(x))
#define SHARDLOCK_PT_GUARDED_BY(x) SHARDLOCK_THREAD_ANNOTATION_(pt_guarded_by(x))
// Functions that acquire or release capabilities (this object when empty).
#define SHARDLOCK_ACQUIRE(...) SHARDLOCK_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define SHARDLOCK_ACQUIRE_SHARED(...) \
  SHARDLOCK_THREAD_ANNOTATION_(acquire_shared_capability(__VA_ARGS__))
#define SHARDLOCK_RELEASE(...) SHARDLOCK_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
#define SHARDLOCK_RELEASE_SHARED(...) \
  SHARDLOCK_THREAD_ANNOTATION_(release_shared_capability(__VA_ARGS__))
#define SHARDLOCK_RELEASE_GENERIC(...) \
  SHARDLOCK_THREAD_ANNOTATION_(release_generic_capability(__VA_ARGS__))
// A function that acquires the capability only when it returns `result`.
#define SHARDLOCK_TRY_ACQUIRE(...) SHARDLOCK_THREAD_ANNOTATION_(try_acquire_capability(__VA_ARGS__))
#define SHARDLOCK_TRY_ACQUIRE_SHARED(...) \
  SHARDLOCK_THREAD_ANNOTATION_(try_acquire_shared_capability(__VA_ARGS__))
// Preconditions on the caller.
#define SHARDLOCK_REQUIRES(...) SHARDLOCK_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define SHARDLOCK_REQUIRES_SHARED(...) \
  SHARDLOCK_THREAD_ANNOTATION_(requires_shared_capability(__VA_ARGS__))
#define SHARDLOCK_EXCLUDES(...) SHARDLOCK_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))
#define SHARDLOCK_RETURN_CAPABILITY(x) SHARDLOCK_THREAD_ANNOTATION_(lock_returned(x))
// For code the analysis cannot follow; every use carries a reason.
#define SHARDLOCK_NO_THREAD_SAFETY_ANALYSIS SHARDLOCK_THREAD_ANNOTATION_(no_thread_safety_analysis)

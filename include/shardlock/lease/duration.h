/* Forwarding header, kept for one release: the lease layer now lives in three
   rooms (wire/, server/, client/; docs/lease-server.md). Include
   "shardlock/lease/wire/duration.h" instead; this path goes away in the next minor
   release. */
#pragma once
#include "shardlock/lease/wire/duration.h"

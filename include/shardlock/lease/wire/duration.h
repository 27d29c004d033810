/* Forwarding header, kept for one release: the duration parser is the tools'
   and the server's, not the wire's (nothing crosses the wire with it), so it
   lives at the lease layer's top level. Include "shardlock/lease/duration.h"
   instead; this path goes away in the next minor release. */
#pragma once
#include "shardlock/lease/duration.h"

/* Forwarding header, kept for one release: FencingValidator is the protected
   resource's check, not the wire's, so it lives at the lease layer's top
   level. Include "shardlock/lease/fencing.h" instead; this path goes away in
   the next minor release. */
#pragma once
#include "shardlock/lease/fencing.h"

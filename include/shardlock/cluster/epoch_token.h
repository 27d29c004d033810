/* Forwarding header, kept for one release: the token format is the wire's
   (every GRANTED carries one), so it lives in the lease layer's wire room
   now. Include "shardlock/lease/wire/epoch_token.h" instead; this path goes
   away in the next minor release. */
#pragma once
#include "shardlock/lease/wire/epoch_token.h"

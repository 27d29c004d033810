# wire_vectors_tool_test: the checked-in codec vectors of the other-language
# clients (clients/java/src/test/resources/wire_vectors.tsv) are exactly
# what shardlock-wire-vectors prints now, so a codec change that would leave
# them stale fails here. Regenerate with:
#   build/dev/tools/shardlock-wire-vectors > clients/java/src/test/resources/wire_vectors.tsv
#
#   cmake -DTOOL=PATH -DEXPECTED=PATH -P wire_vectors_check.cmake
execute_process(COMMAND "${TOOL}" OUTPUT_VARIABLE printed RESULT_VARIABLE status)
if(status EQUAL 2)
  # The AES envelope forms need AES-NI to be made: ctest counts this as
  # skipped (SKIP_REGULAR_EXPRESSION), not as passed.
  message(STATUS "wire vectors: skipped: this CPU has no AES-NI, so the AES vectors cannot be made")
  return()
endif()
if(NOT status EQUAL 0)
  message(FATAL_ERROR "shardlock-wire-vectors failed (${status})")
endif()
file(READ "${EXPECTED}" expected)
if(NOT printed STREQUAL expected)
  message(FATAL_ERROR "${EXPECTED} is stale: it differs from what ${TOOL} prints now. "
                      "Regenerate it: ${TOOL} > ${EXPECTED}")
endif()
string(REGEX MATCHALL "\n(plain|request|sealed|keyid|encrypted|keyid-aes|encrypted-aes)\t" vectors
  "${printed}")
list(LENGTH vectors count)
message(STATUS "wire vectors: ${count} vectors, all current")

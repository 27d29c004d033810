# wire_vectors_tool_test: the checked-in codec vectors of the other-language
# clients (clients/java/src/test/resources/wire_vectors.tsv) are exactly
# what shardlock-wire-vectors prints now, so a codec change that would leave
# them stale fails here. Regenerate with:
#   build/dev/tools/shardlock-wire-vectors > clients/java/src/test/resources/wire_vectors.tsv
#
#   cmake -DTOOL=PATH -DEXPECTED=PATH -P wire_vectors_check.cmake
execute_process(COMMAND "${TOOL}" OUTPUT_VARIABLE printed RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "shardlock-wire-vectors failed (${status})")
endif()
file(READ "${EXPECTED}" expected)
if(NOT printed STREQUAL expected)
  message(FATAL_ERROR "${EXPECTED} is stale: it differs from what ${TOOL} prints now. "
                      "Regenerate it: ${TOOL} > ${EXPECTED}")
endif()
string(REGEX MATCHALL "\n(plain|request|sealed|keyid|encrypted)\t" vectors "${printed}")
list(LENGTH vectors count)
message(STATUS "wire vectors: ${count} vectors, all current")

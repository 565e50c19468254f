# Writes OUT (src/core/version.h) from IN with VERSION and the source tree's
# commit, "-dirty" after it where tracked files differ from it, "unknown"
# outside git. CMakeLists.txt runs it at configure time and again before
# every build, so that a run's outputs name the commit it was built from;
# configure_file leaves OUT untouched while its text stays the same.
#   cmake -DSOURCE=DIR -DIN=FILE -DOUT=FILE -DVERSION=X.Y.Z -P version.cmake
execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY "${SOURCE}"
                OUTPUT_VARIABLE MPIFORMER_GIT_COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE
                RESULT_VARIABLE rc ERROR_QUIET)
if(NOT rc EQUAL 0 OR NOT MPIFORMER_GIT_COMMIT)
  set(MPIFORMER_GIT_COMMIT "unknown")
else()
  execute_process(COMMAND git diff --quiet HEAD -- WORKING_DIRECTORY "${SOURCE}"
                  RESULT_VARIABLE changed ERROR_QUIET)
  if(changed EQUAL 1)
    string(APPEND MPIFORMER_GIT_COMMIT "-dirty")
  endif()
endif()
set(PROJECT_VERSION "${VERSION}")
configure_file("${IN}" "${OUT}" @ONLY)

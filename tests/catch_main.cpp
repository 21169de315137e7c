// The one Catch2 main shared by every test executable (Catch2 2.13 has no
// Catch2WithMain target): compiled once (framelink_catch_main in
// tests/CMakeLists.txt) and linked into each test.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

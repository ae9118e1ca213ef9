// Launch detection under each launcher's variables, priority order, partial and
// malformed environments; host identity and the listen address.
#include <catch2/catch.hpp>

#include <string>

#include <plait/bootstrap/launch.hpp>

#include "bootstrap_support.hpp"

using plait::errc;
using plait::bootstrap::detect_launch;
using plait::bootstrap::launch_info;
using plait::testing::scoped_env;

namespace {

// The message of the invalid_argument that detect_launch() throws ("" if none).
std::string launch_error() {
  try {
    detect_launch();
  } catch (const plait::error& e) {
    if (e.code() == errc::invalid_argument) return e.what();
    return std::string("wrong code: ") + e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("no launcher variables: a world of one", "[launch]") {
  scoped_env env;
  auto info = detect_launch();
  CHECK(info.rank == 0);
  CHECK(info.size == 1);
  CHECK(info.local_rank == 0);
  CHECK(info.store_host.empty());
  CHECK(info.store_port == 0);
  CHECK_FALSE(info.store_served);
  CHECK(info.source == "none");
}

TEST_CASE("each launcher's variables are read", "[launch]") {
  scoped_env env;
  SECTION("plaitrun") {
    env.set("PLAIT_RANK", "2");
    env.set("PLAIT_WORLD_SIZE", "4");
    env.set("PLAIT_LOCAL_RANK", "1");
    env.set("PLAIT_STORE", "127.0.0.1:4000");
    env.set("PLAIT_STORE_SERVED", "1");
    auto info = detect_launch();
    CHECK(info.source == "PLAIT");
    CHECK(info.rank == 2);
    CHECK(info.size == 4);
    CHECK(info.local_rank == 1);
    CHECK(info.store_host == "127.0.0.1");
    CHECK(info.store_port == 4000);
    CHECK(info.store_served);
  }
  SECTION("by hand, IPv6 store, no local rank") {
    env.set("PLAIT_RANK", "0");
    env.set("PLAIT_WORLD_SIZE", "2");
    env.set("PLAIT_STORE", "[::1]:5001");
    auto info = detect_launch();
    CHECK(info.store_host == "::1");
    CHECK(info.store_port == 5001);
    CHECK(info.local_rank == 0);
    CHECK_FALSE(info.store_served);
  }
  SECTION("torchrun: MASTER_ADDR and MASTER_PORT + 1") {
    env.set("RANK", "3");
    env.set("WORLD_SIZE", "8");
    env.set("LOCAL_RANK", "3");
    env.set("MASTER_ADDR", "node0");
    env.set("MASTER_PORT", "29500");
    auto info = detect_launch();
    CHECK(info.source == "torchrun");
    CHECK(info.rank == 3);
    CHECK(info.size == 8);
    CHECK(info.local_rank == 3);
    CHECK(info.store_host == "node0");
    CHECK(info.store_port == 29501);
  }
  SECTION("Open MPI") {
    env.set("OMPI_COMM_WORLD_RANK", "5");
    env.set("OMPI_COMM_WORLD_SIZE", "6");
    env.set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
    env.set("PLAIT_STORE", "10.1.2.3:7000");
    auto info = detect_launch();
    CHECK(info.source == "Open MPI");
    CHECK(info.rank == 5);
    CHECK(info.size == 6);
    CHECK(info.local_rank == 1);
    CHECK(info.store_host == "10.1.2.3");
  }
  SECTION("PMI") {
    env.set("PMI_RANK", "1");
    env.set("PMI_SIZE", "3");
    env.set("MASTER_ADDR", "10.0.0.9");
    env.set("MASTER_PORT", "100");
    auto info = detect_launch();
    CHECK(info.source == "PMI");
    CHECK(info.rank == 1);
    CHECK(info.size == 3);
    CHECK(info.store_port == 101);
  }
  SECTION("Slurm") {
    env.set("SLURM_PROCID", "7");
    env.set("SLURM_NTASKS", "16");
    env.set("SLURM_LOCALID", "3");
    env.set("PLAIT_STORE", "head:1234");
    auto info = detect_launch();
    CHECK(info.source == "Slurm");
    CHECK(info.rank == 7);
    CHECK(info.size == 16);
    CHECK(info.local_rank == 3);
  }
  SECTION("PLAIT_STORE wins over MASTER_ADDR") {
    env.set("RANK", "0");
    env.set("WORLD_SIZE", "2");
    env.set("MASTER_ADDR", "node0");
    env.set("MASTER_PORT", "29500");
    env.set("PLAIT_STORE", "node1:42");
    auto info = detect_launch();
    CHECK(info.store_host == "node1");
    CHECK(info.store_port == 42);
  }
  SECTION("a world of one may name a store it does not need") {
    env.set("WORLD_SIZE", "1");
    env.set("RANK", "0");
    auto info = detect_launch();
    CHECK(info.size == 1);
    CHECK(info.store_host.empty());
  }
}

TEST_CASE("priority: PLAIT, then torchrun, Open MPI, PMI, Slurm", "[launch]") {
  scoped_env env;
  env.set("PLAIT_STORE", "127.0.0.1:9");
  env.set("SLURM_PROCID", "4");
  env.set("SLURM_NTASKS", "10");
  CHECK(detect_launch().source == "Slurm");
  env.set("PMI_RANK", "3");
  env.set("PMI_SIZE", "10");
  CHECK(detect_launch().source == "PMI");
  env.set("OMPI_COMM_WORLD_RANK", "2");
  env.set("OMPI_COMM_WORLD_SIZE", "10");
  CHECK(detect_launch().source == "Open MPI");
  env.set("RANK", "1");
  env.set("WORLD_SIZE", "10");
  CHECK(detect_launch().source == "torchrun");
  env.set("PLAIT_RANK", "0");
  env.set("PLAIT_WORLD_SIZE", "10");
  auto info = detect_launch();
  CHECK(info.source == "PLAIT");
  CHECK(info.rank == 0);
  // A lower family's bad values do not matter once a higher one decides.
  env.set("SLURM_PROCID", "garbage");
  CHECK(detect_launch().rank == 0);
}

TEST_CASE("partial or malformed environments name the variable", "[launch]") {
  scoped_env env;
  SECTION("a rank but no size") {
    env.set("PLAIT_RANK", "0");
    CHECK_THAT(launch_error(), Catch::Contains("PLAIT_WORLD_SIZE"));
  }
  SECTION("a size but no rank") {
    env.set("WORLD_SIZE", "2");
    CHECK_THAT(launch_error(), Catch::Contains("RANK is not set"));
  }
  SECTION("more than one rank and no store") {
    env.set("OMPI_COMM_WORLD_RANK", "0");
    env.set("OMPI_COMM_WORLD_SIZE", "2");
    CHECK_THAT(launch_error(), Catch::Contains("PLAIT_STORE"));
  }
  SECTION("MASTER_ADDR without MASTER_PORT") {
    env.set("RANK", "0");
    env.set("WORLD_SIZE", "2");
    env.set("MASTER_ADDR", "node0");
    CHECK_THAT(launch_error(), Catch::Contains("MASTER_PORT"));
  }
  SECTION("MASTER_PORT at the top of the range") {
    env.set("RANK", "0");
    env.set("WORLD_SIZE", "2");
    env.set("MASTER_ADDR", "node0");
    env.set("MASTER_PORT", "65535");
    CHECK_THAT(launch_error(), Catch::Contains("MASTER_PORT"));
  }
  SECTION("rank out of range") {
    env.set("PLAIT_RANK", "2");
    env.set("PLAIT_WORLD_SIZE", "2");
    env.set("PLAIT_STORE", "127.0.0.1:1");
    CHECK_THAT(launch_error(), Catch::Contains("PLAIT_RANK=2") && Catch::Contains("out of range"));
  }
  SECTION("a size of zero") {
    env.set("PMI_RANK", "0");
    env.set("PMI_SIZE", "0");
    CHECK_THAT(launch_error(), Catch::Contains("PMI_SIZE"));
  }
  SECTION("non-numeric values") {
    for (const char* bad : {"1x", "-1", "+1", " 1", "", "0x10", "99999999999999999999"}) {
      CAPTURE(bad);
      env.set("SLURM_PROCID", bad);
      env.set("SLURM_NTASKS", "4");
      env.set("PLAIT_STORE", "127.0.0.1:1");
      CHECK_THAT(launch_error(), Catch::Contains("SLURM_PROCID"));
    }
  }
  SECTION("a bad local rank") {
    env.set("RANK", "0");
    env.set("WORLD_SIZE", "2");
    env.set("LOCAL_RANK", "two");
    env.set("PLAIT_STORE", "127.0.0.1:1");
    CHECK_THAT(launch_error(), Catch::Contains("LOCAL_RANK"));
  }
  SECTION("a malformed store address") {
    env.set("PLAIT_RANK", "0");
    env.set("PLAIT_WORLD_SIZE", "2");
    for (const char* bad : {"nohost", "host:port", "host:0", ":5"}) {
      CAPTURE(bad);
      env.set("PLAIT_STORE", bad);
      CHECK_THAT(launch_error(), Catch::Contains("PLAIT_STORE"));
    }
  }
  SECTION("PLAIT_STORE_SERVED must be 0 or 1") {
    env.set("PLAIT_STORE_SERVED", "yes");
    CHECK_THAT(launch_error(), Catch::Contains("PLAIT_STORE_SERVED"));
  }
}

TEST_CASE("host identity: PLAIT_HOST_ID, else the host name", "[launch]") {
  scoped_env env;
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  CHECK(plait::bootstrap::host_identity() == name);
  env.set("PLAIT_HOST_ID", "fake-host-3");
  CHECK(plait::bootstrap::host_identity() == "fake-host-3");
}

TEST_CASE("listen address: PLAIT_ADDR, PLAIT_IFNAME, loopback, else the store route", "[launch]") {
  using plait::bootstrap::listen_address_for;
  scoped_env env;
  CHECK(listen_address_for("127.0.0.1", "127.0.0.1") == "127.0.0.1");
  CHECK(listen_address_for("localhost", "::1") == "127.0.0.1");
  CHECK(listen_address_for("10.0.0.1", "10.0.0.7") == "10.0.0.7");
  env.set("PLAIT_IFNAME", "lo");
  CHECK(listen_address_for("10.0.0.1", "10.0.0.7") == "127.0.0.1");
  env.set("PLAIT_IFNAME", "no-such-if0");
  try {
    listen_address_for("10.0.0.1", "10.0.0.7");
    FAIL("an unknown interface was accepted");
  } catch (const plait::error& e) {
    CHECK(e.code() == errc::invalid_argument);
    CHECK_THAT(e.what(), Catch::Contains("no-such-if0") && Catch::Contains("lo"));
  }
  env.set("PLAIT_ADDR", "192.168.5.5");  // wins over PLAIT_IFNAME
  CHECK(listen_address_for("10.0.0.1", "10.0.0.7") == "192.168.5.5");
}

TEST_CASE("is_local_address", "[launch]") {
  using plait::bootstrap::is_local_address;
  CHECK(is_local_address("127.0.0.1"));
  CHECK(is_local_address("localhost"));
  CHECK(is_local_address("0.0.0.0"));
  CHECK_FALSE(is_local_address("192.0.2.1"));  // TEST-NET-1: never assigned to a real host
}

// store_context (the bootstrap_context over the store) and join_world().
#include <catch2/catch.hpp>

#include <chrono>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include <plait/bootstrap/store_context.hpp>

#include "bootstrap_support.hpp"

using namespace std::chrono_literals;
using clk = plait::clock;
using plait::errc;
using namespace plait::bootstrap;

namespace {

const std::vector<std::byte> token(32, std::byte{0x33});

std::vector<std::byte> bytes(const std::string& s) {
  auto* p = reinterpret_cast<const std::byte*>(s.data());
  return std::vector<std::byte>(p, p + s.size());
}
std::string text(const std::vector<std::byte>& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

std::unique_ptr<store_context> context_for(std::uint16_t port, int rank, int size, const std::string& scope) {
  launch_info info;
  info.rank = rank;
  info.size = size;
  info.store_host = "127.0.0.1";
  info.store_port = port;
  info.source = "PLAIT";
  auto client = std::make_shared<store_client>("127.0.0.1", port, token, clk::now() + 2s);
  return std::make_unique<store_context>(client, info, token, "host" + std::to_string(rank), "127.0.0.1", scope,
                                         std::chrono::seconds(5));
}

// A free loopback port (closed again; the small race with other processes is acceptable in tests).
std::uint16_t free_port() {
  auto l = plait::detail::listen_tcp("127.0.0.1", 0);
  return plait::detail::local_port(l.get());
}

}  // namespace

TEST_CASE("contexts exchange keys within their scope and pass barriers", "[context]") {
  store_server server("127.0.0.1", 0, token);
  constexpr int n = 4;
  std::vector<std::future<std::string>> ranks;
  for (int r = 0; r < n; ++r)
    ranks.push_back(std::async(std::launch::async, [&, r]() -> std::string {
      auto a = context_for(server.port(), r, n, "c1/");
      auto b = context_for(server.port(), r, n, "c2/");
      a->put("addr/" + std::to_string(r), bytes("a" + std::to_string(r)));
      b->put("addr/" + std::to_string(r), bytes("b" + std::to_string(r)));
      for (int round = 0; round < 5; ++round) a->barrier("step", clk::now() + 5s);
      std::string seen;
      for (int q = 0; q < n; ++q) {
        seen += text(a->get("addr/" + std::to_string(q), clk::now() + 5s));
        seen += text(b->get("addr/" + std::to_string(q), clk::now() + 5s));
      }
      b->barrier("done", clk::now() + 5s);
      if (a->job_key() == b->job_key()) return "same job key for two scopes";
      return seen + "|" + a->job_key();
    }));
  std::string first_key;
  for (int r = 0; r < n; ++r) {
    auto got = ranks[static_cast<std::size_t>(r)].get();
    CAPTURE(r);
    auto bar = got.find('|');
    REQUIRE(bar != std::string::npos);
    CHECK(got.substr(0, bar) == "a0b0a1b1a2b2a3b3");
    auto key = got.substr(bar + 1);
    if (r == 0) first_key = key;
    CHECK(key == first_key);  // equal on every rank
    CHECK(key.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") ==
          std::string::npos);
  }
  CHECK(first_key.find(server.instance_id().substr(0, 16)) != std::string::npos);
}

TEST_CASE("a barrier timeout names the ranks that did not arrive", "[context]") {
  store_server server("127.0.0.1", 0, token);
  constexpr int n = 4;
  std::vector<std::future<std::string>> arrived;
  for (int r : {0, 2})  // ranks 1 and 3 never come
    arrived.push_back(std::async(std::launch::async, [&, r]() -> std::string {
      auto ctx = context_for(server.port(), r, n, "x/");
      try {
        ctx->barrier("sync", clk::now() + 500ms);
      } catch (const plait::error& e) {
        if (e.code() != errc::timeout) return std::string("wrong code: ") + e.what();
        if (e.rank() != r) return std::string("wrong rank in: ") + e.what();
        return e.what();
      }
      return "passed";
    }));
  for (auto& f : arrived) {
    auto what = f.get();
    CHECK_THAT(what, Catch::Contains("barrier 'sync'") && Catch::Contains("ranks 1, 3 have not arrived"));
  }
}

TEST_CASE("a world of one needs no store", "[context]") {
  launch_info info;
  store_context ctx(nullptr, info, token, "h", "127.0.0.1", "c0/");
  ctx.put("k", bytes("v"));
  CHECK(text(ctx.get("k", clk::now() + 1s)) == "v");
  ctx.barrier("b", clk::now() + 1s);
  try {
    ctx.get("missing", clk::now() + 10s);
    FAIL("a key nobody can publish was found");
  } catch (const plait::error& e) {
    CHECK(e.code() == errc::timeout);
    CHECK_THAT(e.what(), Catch::Contains("c0/missing"));
  }
  CHECK_FALSE(ctx.job_key().empty());

  plait::testing::scoped_env env;  // no launcher variables
  auto w = join_world(clk::now() + 1s);
  CHECK(w.info.size == 1);
  CHECK(w.client == nullptr);
  CHECK(w.server == nullptr);
  CHECK(w.token.size() >= 16);
  auto c = make_context(w, "c0/");
  CHECK(c->size() == 1);
  CHECK(c->listen_address() == "127.0.0.1");
}

TEST_CASE("join_world by hand: rank 0 serves the store, every rank connects", "[context]") {
  plait::testing::temp_dir dir;
  const auto port = free_port();
  constexpr int n = 3;
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r)
    pids.push_back(plait::testing::fork_child(
        [&, r] {
          plait::testing::scoped_env env;
          env.set("PLAIT_RANK", std::to_string(r));
          env.set("PLAIT_WORLD_SIZE", std::to_string(n));
          env.set("PLAIT_STORE", "127.0.0.1:" + std::to_string(port));
          env.set("PLAIT_TOKEN", "by-hand-token-0123456789");
          env.set("PLAIT_HOST_ID", "node" + std::to_string(r % 2));
          auto w = join_world(clk::now() + 10s);
          if ((w.server != nullptr) != (r == 0)) return 20;
          auto ctx = make_context(w, "j/");
          if (ctx->rank() != r || ctx->size() != n || ctx->host_id() != "node" + std::to_string(r % 2)) return 21;
          if (ctx->listen_address() != "127.0.0.1") return 22;
          ctx->put("hello/" + std::to_string(r), bytes("r" + std::to_string(r)));
          for (int q = 0; q < n; ++q)
            if (text(ctx->get("hello/" + std::to_string(q), clk::now() + 10s)) != "r" + std::to_string(q)) return 23;
          ctx->barrier("end", clk::now() + 10s);
          std::ofstream(dir.path() / ("key" + std::to_string(r))) << ctx->job_key();
          // No closing handshake: rank 0 leaves at once, and its exit waits for the
          // others to finish with the store (they may still be reading the barrier's reply).
          return 0;
        },
        /*run_exit_handlers=*/true));
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK(plait::testing::wait_child(pids[static_cast<std::size_t>(r)]) == 0);
  }
  std::vector<std::string> keys(n);
  for (int r = 0; r < n; ++r)
    std::ifstream(dir.path() / ("key" + std::to_string(r))) >> keys[static_cast<std::size_t>(r)];
  CHECK_FALSE(keys[0].empty());
  CHECK(keys[1] == keys[0]);
  CHECK(keys[2] == keys[0]);
}

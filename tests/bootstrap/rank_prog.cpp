// A rank program for the launcher tests: joins the world the environment describes
// (join_world, as communicator::from_env does), exchanges one key with every rank,
// passes a barrier and prints "rank R of N ok <job key>". Errors go to stderr, exit 1.
#include <chrono>
#include <cstdio>
#include <exception>
#include <string>

#include <plait/bootstrap/store_context.hpp>

int main() {
  using namespace std::chrono_literals;
  try {
    auto deadline = plait::clock::now() + 20s;
    auto world = plait::bootstrap::join_world(deadline);
    auto ctx = plait::bootstrap::make_context(world, "prog/");
    const int r = ctx->rank(), n = ctx->size();
    std::string mine = "from " + std::to_string(r);
    ctx->put("hello/" + std::to_string(r), std::as_bytes(std::span(mine.data(), mine.size())));
    for (int q = 0; q < n; ++q) {
      auto v = ctx->get("hello/" + std::to_string(q), deadline);
      std::string got(reinterpret_cast<const char*>(v.data()), v.size());
      if (got != "from " + std::to_string(q)) {
        std::fprintf(stderr, "rank %d read '%s' for rank %d\n", r, got.c_str(), q);
        return 1;
      }
    }
    ctx->barrier("end", deadline);
    std::printf("rank %d of %d ok %s\n", r, n, ctx->job_key().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}

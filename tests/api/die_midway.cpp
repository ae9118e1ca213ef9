// A job in which the last rank dies (SIGKILL) in the middle of its collectives:
// the survivors must each report their own peer_lost naming it. Run under plaitrun
// by plaitrun_survivors.sh, which checks what plaitrun prints.
#include <plait/plait.hpp>
#include <plait/transport/shm.hpp>
#include <plait/transport/tcp.hpp>

#include <signal.h>

#include <cstdio>
#include <cstring>
#include <vector>

template <class Comm>
int run() {
  auto comm = Comm::from_env();
  std::vector<float> v(1 << 18, 1.0f);
  try {
    for (int i = 0; i < 100000; ++i) {
      if (comm.rank() == comm.size() - 1 && i == 20) ::raise(SIGKILL);
      plait::all_reduce<plait::ring>(comm, std::span<float>(v), plait::avg{});
    }
    std::printf("no error after 100000 collectives\n");
    return 0;
  } catch (const plait::error& e) {
    std::printf("survivor %d saw %s naming rank %d\n", comm.rank(), std::string(plait::to_string(e.code())).c_str(),
                e.peer());
    std::fflush(stdout);
    return 1;
  }
}

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "tcp") == 0) return run<plait::communicator<plait::transport::tcp>>();
  return run<plait::communicator<plait::transport::shm>>();
}

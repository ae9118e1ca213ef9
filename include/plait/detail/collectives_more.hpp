// The collectives other than all_reduce (see collectives.hpp for the common contract).
#pragma once

#include <plait/collectives.hpp>

namespace plait {
namespace detail {

template <class Algo, class T>
request all_gather_impl(comm_core& core, std::span<const T> shard, std::span<T> full, call_options opt, bool async) {
  const auto n = static_cast<std::size_t>(core.size());
  const std::uint8_t algo =
      pick_exchange<Algo>(collective_kind::all_gather, full.size_bytes(), core.size(), core.config().network,
                          core.config().shares_copies, core.config().shared_cpus);
  call_builder<T, sum> b(core, collective_kind::all_gather, algo, sum{}, -1, shard.size(), core.next_sequence(), opt);
  b.require_count_fits(shard.size());
  b.require(full.size() == shard.size() * n, "output must hold size() shards: full.size() == shard.size() * n");
  b.require(!overlaps(shard.data(), shard.size_bytes(), full.data(), full.size_bytes()),
            "input and output overlap; all_gather has no in-place form");
  b.require(algo != recursive_doubling::id || recursive_doubling::supports(core.size()),
            "all_gather<recursive_doubling> needs a power-of-two number of ranks; use ring or direct");
  request r;
  auto p = b.sp(shard.size());
  b.finish(
      b.key(p),
      [&] {
        if constexpr (!std::is_same_v<Algo, automatic>)
          return Algo::all_gather(p);
        else
          return algo == direct::id               ? direct::all_gather(p)
                 : algo == recursive_doubling::id ? recursive_doubling::all_gather(p)
                                                  : ring::all_gather(p);
      },
      shard.data(), full.data(), async, &r);
  return r;
}

template <class Algo, class T, class Op>
request reduce_scatter_impl(comm_core& core, std::span<const T> full, std::span<T> shard, Op op, call_options opt,
                            bool async) {
  const auto n = static_cast<std::size_t>(core.size());
  const std::uint8_t algo =
      pick_exchange<Algo>(collective_kind::reduce_scatter, full.size_bytes(), core.size(), core.config().network);
  call_builder<T, Op> b(core, collective_kind::reduce_scatter, algo, op, -1, shard.size(), core.next_sequence(), opt);
  b.require_count_fits(shard.size());
  b.require(full.size() == shard.size() * n, "input must hold size() shards: full.size() == shard.size() * n");
  b.require(!overlaps(shard.data(), shard.size_bytes(), full.data(), full.size_bytes()),
            "input and output overlap; reduce_scatter has no in-place form");
  request r;
  auto p = b.sp(shard.size());
  b.finish(
      b.key(p),
      [&] {
        if constexpr (!std::is_same_v<Algo, automatic>)
          return Algo::reduce_scatter(p);
        else
          return algo == direct::id ? direct::reduce_scatter(p) : ring::reduce_scatter(p);
      },
      full.data(), shard.data(), async, &r);
  return r;
}

template <class Algo, class T>
request broadcast_impl(comm_core& core, std::span<T> buf, int root, call_options opt, bool async) {
  const std::uint8_t algo =
      pick_broadcast<Algo>(buf.size_bytes(), core.size(), core.config().shares_copies, !core.config().chain.empty());
  call_builder<T, sum> b(core, collective_kind::broadcast, algo, sum{}, root, buf.size(), core.next_sequence(), opt);
  b.require(root >= 0 && root < core.size(), "root is out of range [0, size())");
  b.require_count_fits(buf.size());
  auto p = b.sp(buf.size(), root);
  request r;
  b.finish(
      b.key(p),
      [&] {
        if constexpr (!std::is_same_v<Algo, automatic>)
          return Algo::broadcast(p);
        else
          return algo == tree::id ? tree::broadcast(p) : algo == direct::id ? direct::broadcast(p) : ring::broadcast(p);
      },
      buf.data(), buf.data(), async, &r);
  return r;
}

template <class Algo, class T, class Op>
request reduce_impl(comm_core& core, std::span<const T> in, std::span<T> out, Op op, int root, call_options opt,
                    bool async) {
  check_algorithm_id<Algo>();
  constexpr std::uint8_t algo = std::is_same_v<Algo, automatic> ? tree::id : Algo::id;
  call_builder<T, Op> b(core, collective_kind::reduce, algo, op, root, out.size(), core.next_sequence(), opt);
  b.require(root >= 0 && root < core.size(), "root is out of range [0, size())");
  b.require(in.size() == out.size(), "input and output must have the same number of elements on every rank");
  b.require(!overlaps(in.data(), in.size_bytes(), out.data(), out.size_bytes()),
            "input and output overlap; reduce has no in-place form");
  b.require_count_fits(out.size());
  request r;
  auto p = b.sp(out.size(), root);
  b.finish(
      b.key(p),
      [&] {
        if constexpr (std::is_same_v<Algo, automatic>)
          return tree::reduce(p);
        else
          return Algo::reduce(p);
      },
      in.data(), out.data(), async, &r);
  return r;
}

template <class T>
request all_to_all_impl(comm_core& core, std::span<const T> in, std::span<T> out, call_options opt, bool async) {
  const auto n = static_cast<std::size_t>(core.size());
  const std::size_t block = out.size() / n;
  call_builder<T, sum> b(core, collective_kind::all_to_all, direct::id, sum{}, -1, out.size(), core.next_sequence(),
                         opt);
  b.require(in.size() == out.size(), "input and output must have the same number of elements");
  b.require(out.size() % n == 0, "the buffers must hold size() equal blocks (count divisible by the rank count)");
  b.require(!overlaps(in.data(), in.size_bytes(), out.data(), out.size_bytes()),
            "input and output overlap; all_to_all has no in-place form");
  b.require_count_fits(block);
  request r;
  auto p = b.sp(block);
  b.finish(
      b.key(p), [&] { return direct::all_to_all(p); }, in.data(), out.data(), async, &r);
  return r;
}

template <class T>
request send_impl(comm_core& core, std::span<const T> data, int peer, call_options opt, bool async) {
  const bool valid_peer = peer >= 0 && peer < core.size() && peer != core.rank();
  const std::uint64_t seq = valid_peer ? core.next_send(peer) : 0;
  call_builder<T, sum> b(core, collective_kind::point_to_point, direct::id, sum{}, -1, data.size(), seq, opt);
  b.require(peer != core.rank(), "sending to oneself is not allowed");
  b.require(peer >= 0 && peer < core.size(), "peer is out of range [0, size())");
  b.require_count_fits(data.size());
  request r;
  b.finish(
      b.key(b.sp(data.size()), peer), [&] { return direct::send_to(peer, data.size(), b.slice_elems()); }, data.data(),
      nullptr, async, &r);
  return r;
}

template <class T>
request recv_impl(comm_core& core, std::span<T> data, int peer, call_options opt, bool async) {
  const bool valid_peer = peer >= 0 && peer < core.size() && peer != core.rank();
  const std::uint64_t seq = valid_peer ? core.next_recv(peer) : 0;
  call_builder<T, sum> b(core, collective_kind::point_to_point, direct::id, sum{}, -1, data.size(), seq, opt);
  b.require(peer != core.rank(), "receiving from oneself is not allowed");
  b.require(peer >= 0 && peer < core.size(), "peer is out of range [0, size())");
  b.require_count_fits(data.size());
  request r;
  b.finish(
      b.key(b.sp(data.size()), peer, true), [&] { return direct::recv_from(peer, data.size(), b.slice_elems()); },
      nullptr, data.data(), async, &r);
  return r;
}

inline request barrier_impl(comm_core& core, call_options opt, bool async) {
  call_builder<std::uint8_t, sum> b(core, collective_kind::barrier, ring::id, sum{}, -1, 0, core.next_sequence(), opt);
  request r;
  auto p = b.sp(0);
  b.finish(
      b.key(p), [&] { return ring::all_reduce(p); }, nullptr, nullptr, async, &r);
  return r;
}

}  // namespace detail

// ---- all_gather: full.size() == shard.size() * n ------------------------------
template <class Algo = automatic, class Transport, class T>
requires element_type<T> &&
    (std::same_as<Algo, automatic> ||
     has_all_gather<Algo>)void all_gather(communicator<Transport>& comm, std::type_identity_t<std::span<const T>> shard,
                                          std::span<T> full, call_options opt = {}) {
  detail::all_gather_impl<Algo>(comm.core(), shard, full, opt, false);
}
template <class Algo = automatic, class Transport, class T>
requires element_type<T> &&(std::same_as<Algo, automatic> || has_all_gather<Algo>) [[nodiscard]] request
    all_gather_async(communicator<Transport>& comm, std::type_identity_t<std::span<const T>> shard, std::span<T> full,
                     call_options opt = {}) {
  return detail::all_gather_impl<Algo>(comm.core(), shard, full, opt, true);
}

// ---- reduce_scatter: full.size() == shard.size() * n --------------------------
template <class Algo = automatic, class Transport, class T, class Op>
requires reduce_op<Op, T> &&
    (std::same_as<Algo, automatic> ||
     has_reduce_scatter<Algo>)void reduce_scatter(communicator<Transport>& comm,
                                                  std::type_identity_t<std::span<const T>> full, std::span<T> shard,
                                                  Op op, call_options opt = {}) {
  detail::reduce_scatter_impl<Algo>(comm.core(), full, shard, op, opt, false);
}
template <class Algo = automatic, class Transport, class T, class Op>
requires reduce_op<Op, T> &&(std::same_as<Algo, automatic> || has_reduce_scatter<Algo>) [[nodiscard]] request
    reduce_scatter_async(communicator<Transport>& comm, std::type_identity_t<std::span<const T>> full,
                         std::span<T> shard, Op op, call_options opt = {}) {
  return detail::reduce_scatter_impl<Algo>(comm.core(), full, shard, op, opt, true);
}

// ---- broadcast (in place) ------------------------------------------------------
template <class Algo = automatic, class Transport, class T>
requires element_type<T> &&(std::same_as<Algo, automatic> ||
                            has_broadcast<Algo>)void broadcast(communicator<Transport>& comm, std::span<T> buf,
                                                               int root, call_options opt = {}) {
  detail::broadcast_impl<Algo>(comm.core(), buf, root, opt, false);
}
template <class Algo = automatic, class Transport, class T>
requires element_type<T> &&(std::same_as<Algo, automatic> || has_broadcast<Algo>) [[nodiscard]] request
    broadcast_async(communicator<Transport>& comm, std::span<T> buf, int root, call_options opt = {}) {
  return detail::broadcast_impl<Algo>(comm.core(), buf, root, opt, true);
}

// ---- reduce: out has count elements everywhere; only the root's is written -----
template <class Algo = automatic, class Transport, class T, class Op>
requires reduce_op<Op, T> &&
    (std::same_as<Algo, automatic> ||
     has_reduce<Algo>)void reduce(communicator<Transport>& comm, std::type_identity_t<std::span<const T>> in,
                                  std::span<T> out, Op op, int root, call_options opt = {}) {
  detail::reduce_impl<Algo>(comm.core(), in, out, op, root, opt, false);
}
template <class Algo = automatic, class Transport, class T, class Op>
requires reduce_op<Op, T> &&(std::same_as<Algo, automatic> || has_reduce<Algo>) [[nodiscard]] request
    reduce_async(communicator<Transport>& comm, std::type_identity_t<std::span<const T>> in, std::span<T> out, Op op,
                 int root, call_options opt = {}) {
  return detail::reduce_impl<Algo>(comm.core(), in, out, op, root, opt, true);
}

// ---- all_to_all: in/out hold n equal blocks ------------------------------------
template <class Transport, class T>
requires element_type<T>
void all_to_all(communicator<Transport>& comm, std::type_identity_t<std::span<const T>> in, std::span<T> out,
                call_options opt = {}) {
  detail::all_to_all_impl(comm.core(), in, out, opt, false);
}
template <class Transport, class T>
requires element_type<T>
[[nodiscard]] request all_to_all_async(communicator<Transport>& comm, std::type_identity_t<std::span<const T>> in,
                                       std::span<T> out, call_options opt = {}) {
  return detail::all_to_all_impl(comm.core(), in, out, opt, true);
}

// ---- send / recv (T may be const for send) -------------------------------------
template <class Transport, class T>
requires element_type<std::remove_const_t<T>>
void send(communicator<Transport>& comm, std::span<T> data, int peer, call_options opt = {}) {
  detail::send_impl(comm.core(), std::span<const std::remove_const_t<T>>(data), peer, opt, false);
}
template <class Transport, class T>
requires element_type<std::remove_const_t<T>>
[[nodiscard]] request send_async(communicator<Transport>& comm, std::span<T> data, int peer, call_options opt = {}) {
  return detail::send_impl(comm.core(), std::span<const std::remove_const_t<T>>(data), peer, opt, true);
}
template <class Transport, class T>
requires element_type<T>
void recv(communicator<Transport>& comm, std::span<T> data, int peer, call_options opt = {}) {
  detail::recv_impl(comm.core(), data, peer, opt, false);
}
template <class Transport, class T>
requires element_type<T>
[[nodiscard]] request recv_async(communicator<Transport>& comm, std::span<T> data, int peer, call_options opt = {}) {
  return detail::recv_impl(comm.core(), data, peer, opt, true);
}

// ---- barrier --------------------------------------------------------------------
template <class Transport>
void barrier(communicator<Transport>& comm, call_options opt = {}) {
  detail::barrier_impl(comm.core(), opt, false);
}
template <class Transport>
[[nodiscard]] request barrier_async(communicator<Transport>& comm, call_options opt = {}) {
  return detail::barrier_impl(comm.core(), opt, true);
}

}  // namespace plait

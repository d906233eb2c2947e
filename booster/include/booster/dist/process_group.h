// process_group.h — the one adapter between Booster and c10d. Plugins call collectives only here.
//
// Backends: "gloo" (CPU, c10d::ProcessGroupGloo) and, when LibTorch has CUDA, "nccl". Rendezvous is
// through c10d::TCPStore. Collectives that Gloo lacked in LibTorch 1.13 are built here, in one place
// (faster than LibTorch 2.11 Gloo's own at 16 and 128 MiB; docs/benchmarks.md, collectives):
//   - reduce_scatter_tensor / all_gather_into_tensor: a pairwise exchange over Gloo point-to-point
//     (process_group_scatter.cpp): each rank sends and receives (N-1)/N of the buffer, as a ring
//     would, all messages posted at once; chunks travel in their own dtype (bf16 as bf16) and
//     reduce-scatter sums in float32 for bf16/fp16, in rank order (the same on every rank);
//   - ReduceOp::AVG: SUM, then division by size() when the work is waited for;
//   - bfloat16 allreduce: a reduce-scatter then an all-gather of the bf16 buffer over those
//     pairwise exchanges (bf16 on the wire, each range summed in float32 in rank order and rounded
//     once, so every rank gets the same bits); half the bytes of an fp32 allreduce. A helper thread
//     posts the all-gather half as soon as the reduce-scatter half is done, so ranks may wait for
//     their allreduces in any order;
//   - bfloat16 broadcast / reduce / allgather: cast to float32 for the wire, cast back on wait
//     (Gloo has no bf16).
// Point-to-point tags: user tags [0, 2^29), isend_tensor [2^29, 2^30), these collectives 2^30 + k.
//
// All collectives are asynchronous: they return a Work that must be waited for before the output
// is read (wait() also runs the emulation's finishing step). A collective that fails or times out
// (timeout_s) raises DistError whose message ends with a health check: every rank of a world of
// more than one writes a heartbeat (time, count of world collectives) to the store each second, and
// the check names ranks whose heartbeat is stale (stopped, hung, dead) or whose count is behind
// this rank's (stuck outside collectives), or says that the store itself (rank 0) did not answer.
// The same check runs ahead of the timeout: when a rank's count of world collectives has not moved
// for max(timeout_s / 2, timeout_s - 30) seconds, it logs what the check finds (an error line on
// every waiting rank; nothing when all ranks are alive and in step). On a device backend (NCCL),
// whose collectives do not block the host and whose timeouts c10d's watchdog turns into the end of
// the process, that line is what names the ranks. Every rank must call the same
// collectives in the same order with tensors of the same numel and dtype (as in c10d).
//
// Sub-groups (new_group, split) are ProcessGroups too: every collective and emulation above works
// on them, and "rank" in their collectives (roots, chunk order) is the rank inside the sub-group.
// They connect through the world's store under a key prefix of their own (no new store or store
// port) and share the world's Gloo device; a sub-group of one rank has no backend at all (its
// collectives are local copies).
//
// Point-to-point (isend/irecv, send/recv, batch_isend_irecv, isend_tensor/recv_tensor) is
// torch.distributed's, for pipeline stages: see "Point-to-point" below.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "booster/export.h"

namespace booster::dist {

// A collective failed or timed out (message from c10d/Gloo included) or was called wrongly.
class BOOSTER_API DistError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class ReduceOp { SUM, AVG, MAX, MIN, PRODUCT };

// One operation of ProcessGroup::batch_isend_irecv (torch.distributed.P2POp): send `tensor` to, or
// receive it from, rank `peer` of the group with `tag`.
struct P2POp {
  enum class Kind { kSend, kRecv } kind;
  at::Tensor tensor;
  int peer;
  int tag = 0;
};

// Handle of an asynchronous collective. wait() blocks until done, rethrows the backend's error as
// DistError, then runs the finishing step (copy-back, division). Waiting twice is a no-op.
// is_completed() does not block. A collective made of point-to-point parts (reduce-scatter,
// all-gather, the bf16 allreduce) is completed only when every part is; c10d's Gloo send and recv
// works report completion only once waited for, so these report false until wait() returned.
class BOOSTER_API Work {
 public:
  Work() = default;  // a completed no-op work
  bool is_completed() const;
  void wait();

  struct Impl;
  explicit Work(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

 private:
  std::shared_ptr<Impl> impl_;
};

struct RendezvousOptions {
  std::string host = "127.0.0.1";  // store host (rank 0's address, MASTER_ADDR)
  int port = 29500;                // store port (MASTER_PORT)
  int rank = 0;
  int world_size = 1;
  std::string backend = "gloo";  // "gloo" | "nccl" | a name registered with register_device_backend
  double timeout_s = 1800;       // per-collective and rendezvous timeout, seconds (c10d default)
  // true under torchrun: the elastic agent already serves the store, every rank is a client, and
  // keys live under "/worker/attempt_<restart_count>/" as in torch.distributed.
  bool use_agent_store = false;
  int restart_count = 0;
};

class BOOSTER_API ProcessGroup {
 public:
  // Connects to (rank 0: serves, unless use_agent_store) the TCPStore at host:port, waits for all
  // world_size ranks, and creates the backend's process group. world_size == 1 uses an in-process
  // store and never opens a port. Throws DistError naming host:port and the timeout on failure,
  // std::invalid_argument for rank outside [0, world_size) or an unknown backend.
  static std::shared_ptr<ProcessGroup> rendezvous(const RendezvousOptions& options);

  ~ProcessGroup();
  int rank() const;
  int size() const;
  const std::string& backend() const;
  double timeout_s() const;

  // In-place allreduce of each tensor (same numel/dtype on every rank; dense, contiguous).
  Work allreduce(std::vector<at::Tensor>& tensors, ReduceOp op = ReduceOp::SUM);
  Work allreduce(at::Tensor& tensor, ReduceOp op = ReduceOp::SUM);
  // In-place broadcast from `root` (a rank of this group).
  Work broadcast(at::Tensor& tensor, int root);
  // outputs[i] receives rank i's input; outputs.size() == size(), each like `input`.
  Work allgather(std::vector<at::Tensor>& outputs, const at::Tensor& input);
  // output (numel = size() * input.numel(), same dtype) receives the inputs in rank order. The input
  // may be this rank's chunk of the output (in-place all-gather, as ZeRO's parameter all-gather).
  Work all_gather_into_tensor(at::Tensor& output, const at::Tensor& input);
  // input (numel = size() * output.numel()) is reduced across ranks; this rank gets chunk rank().
  // Sends (N-1)/N of input and receives as much (pairwise); `input` must stay unchanged until wait().
  // Temporary memory: N-1 received chunks (about one input). bf16/fp16 are summed in float32.
  Work reduce_scatter_tensor(at::Tensor& output, const at::Tensor& input, ReduceOp op = ReduceOp::SUM);
  // In-place reduce-scatter with per-rank counts (MPI_Reduce_scatter with MPI_IN_PLACE and
  // recvcounts): `buffer` (contiguous, numel = counts[0] + ... + counts[size()-1], the same counts
  // on every rank) is split into consecutive ranges, counts[r] elements for rank r (0 allowed); after
  // wait() this rank's range holds the reduction of that range over all ranks, the other ranges are
  // unchanged (only read). Sends the other ranges and receives its own from every rank, as
  // reduce_scatter_tensor (same summation order, float32 for bf16/fp16; temporary memory: N-1
  // copies of this rank's range). ZeRO's gradient buckets, whose ranges follow the shards.
  // Throws DistError for a count list of the wrong length, a negative count, or counts that do not
  // add up to buffer.numel().
  Work reduce_scatter_in_place(at::Tensor& buffer, const std::vector<int64_t>& counts, ReduceOp op = ReduceOp::SUM);
  // In-place all-gather with per-rank counts (MPI_Allgatherv with MPI_IN_PLACE): rank r's range of
  // `buffer` (laid out as in reduce_scatter_in_place) is sent to every rank; after wait() every range
  // holds its owner's values. Same errors as reduce_scatter_in_place.
  Work all_gather_in_place(at::Tensor& buffer, const std::vector<int64_t>& counts);
  // torch.distributed.all_to_all_single with split sizes (MPI_Alltoallv): `input` (contiguous,
  // numel = input_counts[0] + ... + input_counts[size()-1]) is split into consecutive ranges,
  // input_counts[p] elements for rank p; after wait() `output` (contiguous, the input's dtype,
  // numel = the sum of output_counts) holds, at offset output_counts[0] + ... +
  // output_counts[p-1], the range rank p sent to this rank (this rank's own range is copied).
  // input_counts[p] on this rank must equal output_counts[rank] on rank p; a mismatch is not
  // detected (as point-to-point below). Any dtype: the bytes travel as they are (float8 as uint8
  // views, see dist/fp8.h). Gloo: pairwise point-to-point, all messages posted at once, each rank
  // sends and receives (N-1)/N of its buffers; NCCL: its all-to-all. `input` must stay unchanged
  // until wait(). Throws DistError for count lists of the wrong length, negative counts, or counts
  // that do not add up to the tensors' numel, or a dtype mismatch.
  Work all_to_all_single(at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& output_counts,
                         const std::vector<int64_t>& input_counts);
  // The split those two use for an even division: numel / size elements per rank, the first
  // numel % size ranks one more.
  static std::vector<int64_t> even_counts(int64_t numel, int size);
  // As reduce_scatter_tensor, but `input` is scratch: its contents are unspecified once the work is
  // waited for (the pairwise exchange only reads it; a backend may reduce in place).
  Work reduce_scatter_tensor_consuming(at::Tensor& output, at::Tensor& input, ReduceOp op = ReduceOp::SUM);
  // All-to-all of equal ranges (torch.distributed.all_to_all_single without split sizes; MPI_Alltoall):
  // `input` and `output` (contiguous, same numel and dtype, numel divisible by size(), distinct
  // memory) are each cut into size() consecutive ranges of numel / size() elements; range p of this
  // rank's input goes to rank p, and range p of this rank's output receives rank p's range rank().
  // Gloo's alltoall on CPU (bf16 travels as float32 when the backend has no bf16), the device
  // backend's on its device, host staging otherwise. A group of one rank copies input to output.
  // DistError for mismatched numel or dtype, a numel not divisible by size(), or a non-contiguous
  // tensor. Sequence parallelism's head/sequence exchange (booster/nn/sequence_parallel.h).
  Work all_to_all_single(at::Tensor& output, const at::Tensor& input);
  // Reduces `tensor` across ranks into root's `tensor` (in place there); on other ranks the
  // contents of `tensor` are unspecified afterwards (the backend may use it as scratch). Gloo has
  // it natively (SUM/MAX/MIN/PRODUCT; AVG and bf16 emulated as above).
  Work reduce(at::Tensor& tensor, int root, ReduceOp op = ReduceOp::SUM);
  // Blocks until every rank arrived.
  void barrier();

  // Convenience, blocking: every rank's 64-bit values, rank-major ([size()][values.size()]);
  // every rank must pass the same count.
  std::vector<std::vector<int64_t>> all_gather_int64(const std::vector<int64_t>& values);
  // Blocking MAX/SUM allreduce of one number (e.g. "did any rank overflow").
  double allreduce_scalar(double value, ReduceOp op);
  // Blocking broadcast of a byte string from root (length first, then bytes).
  std::string broadcast_string(const std::string& value, int root);

  // ---- Point-to-point (torch.distributed.send/recv/isend/irecv/batch_isend_irecv)
  //
  // `peer` is a rank of THIS group (on a sub-group, its rank inside the sub-group), in [0, size())
  // and not rank(). A receive matches the send from `peer` with the same tag; it fills `tensor` in
  // place, which must have the sent tensor's numel and dtype (any dtype; bfloat16 included, the
  // bytes travel as they are). Messages between one pair with different tags match independently,
  // in any order of posting; messages with the same tag match in posting order (Gloo keeps one
  // FIFO queue per peer and tag). Point-to-point never matches a collective (Gloo's collectives use
  // other slots) nor another group's traffic.
  //
  // Gloo's tcp transport transmits a send only once the peer posted the matching receive: isend
  // and irecv never block the caller, but a blocking send() returns only after the peer posted its
  // recv, so two ranks that both send() before they recv() deadlock (use isend, or
  // batch_isend_irecv). A numel mismatch is NOT detected: a smaller message fills the start of
  // `tensor` and leaves the rest, a larger one makes Gloo's network thread abort the process. Use
  // isend_tensor/recv_tensor when the receiver does not know the shape.
  //
  // Tags: user tags are in [0, kMaxP2PTag] (2^29 - 1); isend_tensor/recv_tensor use the internal
  // tag kMaxP2PTag + 1 + tag for both their header and their data, so they never match plain
  // isend/irecv on any tag.
  //
  // Throw std::invalid_argument, before any communication, for an undefined, sparse, non-CPU or
  // non-contiguous tensor, a peer outside [0, size()) or equal to rank() (naming both), a tag
  // outside [0, kMaxP2PTag], and on a group of one rank (it has no peer). The backend's failure or
  // timeout is a DistError from the call or from wait(), e.g. "booster: isend of 6 Float elements
  // to rank 1 (tag 0) failed: ..."; after a timeout Gloo has closed the group's connections and the
  // group is unusable.
  static constexpr int kMaxP2PTag = (1 << 29) - 1;

  // Asynchronous: the tensors must stay alive and unchanged (isend) / unread (irecv) until wait().
  Work isend(const at::Tensor& tensor, int peer, int tag = 0);
  Work irecv(at::Tensor& tensor, int peer, int tag = 0);
  // Blocking: isend/irecv, then wait().
  void send(const at::Tensor& tensor, int peer, int tag = 0);
  void recv(at::Tensor& tensor, int peer, int tag = 0);
  // Posts every op in order (all arguments are checked first) and returns one Work per op, in the
  // same order; the recv ops' tensors are filled when their Work is waited for.
  std::vector<Work> batch_isend_irecv(std::vector<P2POp>& ops);

  // A tensor whose shape and dtype the receiver does not know (a pipeline stage's activation): a
  // header of kP2PHeaderLen int64 (a check word, c10::ScalarType code, ndim, numel, sizes) then
  // the data (none for numel 0), in that order on one internal tag, so several isend_tensor on one
  // peer and tag arrive in posting order (one thread receives per peer and tag). Any
  // dense tensor (a non-contiguous one is sent as a contiguous copy) of at most kMaxP2PDims
  // dimensions (std::invalid_argument otherwise). recv_tensor blocks and returns a new contiguous
  // CPU tensor of the sent shape and dtype; DistError for a header that is not one (a peer
  // sending something else on the internal tag).
  static constexpr int kMaxP2PDims = 8;
  static constexpr int kP2PHeaderLen = 4 + kMaxP2PDims;
  Work isend_tensor(const at::Tensor& tensor, int peer, int tag = 0);
  at::Tensor recv_tensor(int peer, int tag = 0);

  // ---- Sub-groups

  // torch.distributed.new_group: the group of this group's ranks listed in `ranks` (ranks of this
  // group, any order). Collective over this WHOLE group: every rank calls it with the same list,
  // and every rank makes its new_group/split calls in the same order, members or not. Returns
  // nullptr on ranks not in the list. In the new group, rank r is the r-th smallest listed rank.
  // Throws std::invalid_argument, before any communication, for an empty list or one with ranks
  // outside [0, size()) or repeated (naming them); DistError when the ranks passed different lists
  // (detected by comparing a hash of the list: one all-gather of an int64; the message names rank
  // 0's list and the first differing rank's) or when the members cannot connect within timeout_s().
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks);
  // MPI_Comm_split: the ranks of this group that pass the same color form one group, ordered by
  // (key, rank in this group); a negative color returns nullptr (MPI_UNDEFINED). Collective over
  // this whole group like new_group (one all-gather of two int64 values); ranks may pass
  // different colors and keys. Throws DistError when the members cannot connect.
  std::shared_ptr<ProcessGroup> split(int color, int key);

  // ranks_in_parent()[r]: the rank, in the group this one was made from, of this group's rank r
  // (0..size()-1 for a rendezvous group). global_ranks()[r]: the same in the rendezvous (world)
  // group. global_rank(r) is global_ranks()[r] (std::invalid_argument outside [0, size())),
  // group_rank(g) its inverse, -1 when world rank g is not a member (the names and meaning of
  // torch.distributed.get_global_rank / get_group_rank).
  const std::vector<int>& ranks_in_parent() const;
  const std::vector<int>& global_ranks() const;
  int global_rank(int group_rank) const;
  int group_rank(int global_rank) const;

  struct Impl;
  explicit ProcessGroup(std::unique_ptr<Impl> impl);

 private:
  // Point-to-point: checks a call's arguments (std::invalid_argument; tensor may be null), and
  // posts one Gloo send/recv on `wire_tag` (`what` starts its error messages).
  void check_p2p(const char* op, const at::Tensor* tensor, int peer, int tag) const;
  Work post_p2p(bool send, const at::Tensor& tensor, int peer, int wire_tag, std::string what);
  std::unique_ptr<Impl> impl_;
};

}  // namespace booster::dist

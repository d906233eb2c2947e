// process_group_alltoall_test.cpp — ProcessGroup::all_to_all_single (process_group_alltoall.cpp) on 3
// ranks as threads: range p of every rank's input arrives as range r on rank p (exact), bf16 too,
// and a numel the group size does not divide is a DistError. Its use along tensor dims is tested in
// sequence_parallel_test.cpp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "booster/dist/process_group.h"
#include "common/thread_ranks.h"

namespace process_group_alltoall_test {

using AllToAllGroup = std::shared_ptr<booster::dist::ProcessGroup>;

TEST(ProcessGroupAllToAll, SingleSendsRangePToRankPInFloat32AndBf16) {
  auto errors = booster::testing::run_thread_ranks(3, [](const AllToAllGroup& g) {
    const int r = g->rank();
    at::Tensor in = at::arange(6, at::kFloat) + 100 * r;  // ranges of 2: [100r, 100r+1], ...
    at::Tensor out = at::empty_like(in);
    g->all_to_all_single(out, in).wait();
    for (int p = 0; p < 3; ++p) {
      EXPECT_EQ(out[2 * p].item<float>(), 100 * p + 2 * r);
      EXPECT_EQ(out[2 * p + 1].item<float>(), 100 * p + 2 * r + 1);
    }
    at::Tensor in16 = in.to(at::kBFloat16), out16 = at::empty_like(in16);
    g->all_to_all_single(out16, in16).wait();
    EXPECT_TRUE(at::equal(out16, out.to(at::kBFloat16)));
    at::Tensor bad = at::empty({5});
    EXPECT_THROW(g->all_to_all_single(bad, at::zeros({5})), booster::dist::DistError);
  });
  EXPECT_EQ(errors, std::vector<std::string>(3, ""));
}

}  // namespace process_group_alltoall_test

// process_mesh_test.cpp — dist::ProcessMesh on ranks as threads with real Gloo groups: row-major
// coordinates, the members of every dimension's group and an allreduce over each, multi-dimension
// groups, size-1 dimensions and a world of one, and the construction errors.
#include "booster/dist/process_mesh.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/thread_ranks.h"

namespace {

using booster::dist::DistError;
using booster::dist::ProcessGroup;
using booster::dist::ProcessMesh;
using booster::dist::ReduceOp;
using booster::testing::run_thread_ranks;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;
using Group = std::shared_ptr<ProcessGroup>;

// Sum over `group` of (world rank + 1).
double sum_of_ranks(const Group& group, int world_rank) {
  at::Tensor t = at::full({1}, static_cast<double>(world_rank + 1), at::kDouble);
  group->allreduce(t).wait();
  return t.item<double>();
}

TEST(ProcessMesh, DpByTpOnFourRanks) {
  auto errors = run_thread_ranks(4, [](const Group& world) {
    const int wr = world->rank();
    ProcessMesh mesh(world, {{"dp", 2}, {"tp", 2}});
    ASSERT_EQ(mesh.dims().size(), 2u);
    EXPECT_EQ(mesh.dims()[0].name, "dp");
    EXPECT_EQ(mesh.dims()[1].name, "tp");
    EXPECT_EQ(mesh.size("dp"), 2);
    EXPECT_EQ(mesh.size("tp"), 2);
    EXPECT_EQ(mesh.coordinate("dp"), wr / 2);
    EXPECT_EQ(mesh.coordinate("tp"), wr % 2);
    EXPECT_THAT(mesh.coordinates(), ElementsAre(wr / 2, wr % 2));
    EXPECT_THAT(mesh.coordinates_of(2), ElementsAre(1, 0));
    EXPECT_EQ(mesh.rank_of({0, 1}), 1);
    EXPECT_EQ(mesh.rank_of({1, 1}), 3);

    // tp groups are consecutive ranks {0,1} {2,3}; dp groups {0,2} {1,3}.
    const Group& tp = mesh.group("tp");
    const Group& dp = mesh.group("dp");
    EXPECT_EQ(tp->global_ranks(), (wr < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3}));
    EXPECT_EQ(dp->global_ranks(), (wr % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3}));
    EXPECT_EQ(tp->rank(), mesh.coordinate("tp"));
    EXPECT_EQ(dp->rank(), mesh.coordinate("dp"));
    EXPECT_DOUBLE_EQ(sum_of_ranks(tp, wr), wr < 2 ? 1 + 2 : 3 + 4);
    EXPECT_DOUBLE_EQ(sum_of_ranks(dp, wr), wr % 2 == 0 ? 1 + 3 : 2 + 4);
    // Broadcast from tp rank 1 of each tp group: world ranks 1 and 3.
    at::Tensor b = at::full({1}, static_cast<float>(wr));
    tp->broadcast(b, 1).wait();
    EXPECT_EQ(b.item<float>(), wr < 2 ? 1 : 3);

    // Both dims span the world; the order of the names does not matter.
    EXPECT_EQ(mesh.group({"dp", "tp"}), world);
    EXPECT_EQ(mesh.group({"tp", "dp"}), world);
    EXPECT_EQ(mesh.group({"tp"}), tp);
    EXPECT_DOUBLE_EQ(sum_of_ranks(world, wr), 10);
  });
  EXPECT_EQ(errors, std::vector<std::string>(4, ""));
}

TEST(ProcessMesh, SizeOneDimensionsShareALocalGroup) {
  auto errors = run_thread_ranks(4, [](const Group& world) {
    const int wr = world->rank();
    ProcessMesh mesh(world, {{"dp", 2}, {"pp", 1}, {"tp", 2}, {"sp", 1}});
    EXPECT_THAT(mesh.coordinates(), ElementsAre(wr / 2, 0, wr % 2, 0));
    EXPECT_EQ(mesh.rank_of({1, 0, 1, 0}), 3);
    const Group& pp = mesh.group("pp");
    EXPECT_EQ(pp->size(), 1);
    EXPECT_EQ(pp->rank(), 0);
    EXPECT_THAT(pp->global_ranks(), ElementsAre(wr));
    EXPECT_EQ(mesh.group("sp"), pp);
    EXPECT_DOUBLE_EQ(sum_of_ranks(pp, wr), wr + 1);
    EXPECT_EQ(mesh.group("tp")->global_ranks(), (wr < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3}));
    EXPECT_EQ(mesh.group("dp")->global_ranks(), (wr % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3}));
    // A size-1 dim adds nothing to a set: {pp, tp} is tp's group, {pp, sp} this rank alone.
    EXPECT_EQ(mesh.group({"pp", "tp"}), mesh.group("tp"));
    EXPECT_EQ(mesh.group({"pp", "sp"}), pp);
    EXPECT_EQ(mesh.group({"dp", "pp", "tp"}), world);
  });
  EXPECT_EQ(errors, std::vector<std::string>(4, ""));
}

TEST(ProcessMesh, ThreeDimensionsOnEightRanksAsDocumented) {
  auto errors = run_thread_ranks(8, [](const Group& world) {
    const int wr = world->rank();
    ProcessMesh mesh(world, {{"dp", 2}, {"pp", 2}, {"tp", 2}});
    const int dp = wr / 4, pp = (wr / 2) % 2, tp = wr % 2;
    EXPECT_THAT(mesh.coordinates(), ElementsAre(dp, pp, tp));
    const int first_tp = wr - tp, first_pp = wr - 2 * pp, first_dp = wr - 4 * dp;
    EXPECT_EQ(mesh.group("tp")->global_ranks(), (std::vector<int>{first_tp, first_tp + 1}));
    EXPECT_EQ(mesh.group("pp")->global_ranks(), (std::vector<int>{first_pp, first_pp + 2}));
    EXPECT_EQ(mesh.group("dp")->global_ranks(), (std::vector<int>{first_dp, first_dp + 4}));
    EXPECT_DOUBLE_EQ(sum_of_ranks(mesh.group("tp"), wr), 2 * first_tp + 3);
    EXPECT_DOUBLE_EQ(sum_of_ranks(mesh.group("pp"), wr), 2 * first_pp + 4);
    EXPECT_DOUBLE_EQ(sum_of_ranks(mesh.group("dp"), wr), 2 * first_dp + 6);

    // {dp, tp}: {0,1,4,5} and {2,3,6,7}, group rank = row-major over (dp, tp).
    Group dp_tp = mesh.group({"tp", "dp"});
    const std::vector<int> want = pp == 0 ? std::vector<int>{0, 1, 4, 5} : std::vector<int>{2, 3, 6, 7};
    EXPECT_EQ(dp_tp->global_ranks(), want);
    EXPECT_EQ(dp_tp->rank(), dp * 2 + tp);
    EXPECT_DOUBLE_EQ(sum_of_ranks(dp_tp, wr), pp == 0 ? 1 + 2 + 5 + 6 : 3 + 4 + 7 + 8);
    EXPECT_EQ(mesh.group({"dp", "tp"}), dp_tp) << "made once, then cached";
    Group pp_tp = mesh.group({"pp", "tp"});
    EXPECT_EQ(pp_tp->global_ranks(), (dp == 0 ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{4, 5, 6, 7}));
    EXPECT_DOUBLE_EQ(sum_of_ranks(pp_tp, wr), dp == 0 ? 10 : 26);
    // Groups of different dims carry traffic independently when launched together.
    at::Tensor a = at::full({1}, 1.f), b = at::full({1}, 100.f);
    auto wa = mesh.group("tp")->allreduce(a);
    auto wb = dp_tp->allreduce(b);
    wb.wait();
    wa.wait();
    EXPECT_EQ(a.item<float>(), 2);
    EXPECT_EQ(b.item<float>(), 400);
  });
  EXPECT_EQ(errors, std::vector<std::string>(8, ""));
}

TEST(ProcessMesh, OneDimensionSpanningTheWorldIsTheWorld) {
  auto errors = run_thread_ranks(2, [](const Group& world) {
    ProcessMesh mesh(world, {{"pp", 1}, {"dp", 2}});
    EXPECT_EQ(mesh.group("dp"), world);
    EXPECT_EQ(mesh.coordinate("dp"), world->rank());
    EXPECT_EQ(mesh.group("pp")->size(), 1);
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

TEST(ProcessMesh, WorldOfOne) {
  auto errors = run_thread_ranks(1, [](const Group& world) {
    ProcessMesh mesh(world, {{"dp", 1}, {"pp", 1}, {"tp", 1}});
    EXPECT_THAT(mesh.coordinates(), ElementsAre(0, 0, 0));
    for (const char* dim : {"dp", "pp", "tp"}) {
      EXPECT_EQ(mesh.group(dim), world) << dim;
      EXPECT_EQ(mesh.coordinate(dim), 0);
    }
    EXPECT_EQ(mesh.group({"tp", "dp"}), world);
    EXPECT_DOUBLE_EQ(sum_of_ranks(mesh.group("tp"), 0), 1);
    EXPECT_EQ(mesh.rank_of({0, 0, 0}), 0);
  });
  EXPECT_EQ(errors, std::vector<std::string>(1, ""));
}

TEST(ProcessMesh, BadMeshesAreInvalidArguments) {
  auto errors = run_thread_ranks(4, [](const Group& world) {
    using Dims = std::vector<ProcessMesh::Dim>;
    auto build = [&](Dims dims) { ProcessMesh mesh(world, std::move(dims)); };
    EXPECT_THAT([&] { build({{"dp", 2}, {"tp", 3}}); },
                ThrowsMessage<std::invalid_argument>(AllOf(HasSubstr("ProcessMesh dp=2 x tp=3 does not match the world"),
                                                           HasSubstr("must equal the world size 4"))));
    EXPECT_THAT([&] { build({{"dp", 2}}); },
                ThrowsMessage<std::invalid_argument>(HasSubstr("dp=2 does not match the world")));
    EXPECT_THAT([&] { build({{"dp", 4}, {"tp", 0}}); },
                ThrowsMessage<std::invalid_argument>(
                    HasSubstr("dimension 'tp' has size 0; sizes must be >= 1 (dp=4 x tp=0)")));
    EXPECT_THAT([&] { build({{"dp", -4}, {"tp", -1}}); },
                ThrowsMessage<std::invalid_argument>(HasSubstr("dimension 'dp' has size -4")));
    EXPECT_THAT([&] { build({{"dp", 2}, {"dp", 2}}); },
                ThrowsMessage<std::invalid_argument>(HasSubstr("dimension 'dp' appears twice (dp=2 x dp=2)")));
    EXPECT_THAT([&] { build({{"dp", 2}, {"", 2}}); },
                ThrowsMessage<std::invalid_argument>(HasSubstr("dimension 1 has an empty name")));
    EXPECT_THAT([&] { build({}); },
                ThrowsMessage<std::invalid_argument>(HasSubstr("ProcessMesh needs at least one dimension")));
    EXPECT_THAT([&] { ProcessMesh mesh(nullptr, {{"dp", 4}}); },
                ThrowsMessage<std::invalid_argument>(HasSubstr("ProcessMesh(dp=4): the world group is null")));

    // Errors after a good construction: names, coordinates, ranks.
    ProcessMesh mesh(world, {{"dp", 2}, {"tp", 2}});
    EXPECT_THAT([&] { mesh.size("pp"); },
                ThrowsMessage<std::invalid_argument>(HasSubstr("ProcessMesh has no dimension 'pp' (dims: dp, tp)")));
    EXPECT_THAT([&] { mesh.group("TP"); }, ThrowsMessage<std::invalid_argument>(HasSubstr("no dimension 'TP'")));
    EXPECT_THAT([&] { mesh.group(std::vector<std::string>{}); },
                ThrowsMessage<std::invalid_argument>(HasSubstr("group needs at least one dimension")));
    EXPECT_THAT([&] { mesh.group({"dp", "tp", "dp"}); },
                ThrowsMessage<std::invalid_argument>(HasSubstr("dimension 'dp' listed more than once")));
    EXPECT_THAT([&] { mesh.rank_of({1}); },
                ThrowsMessage<std::invalid_argument>(HasSubstr("rank_of needs 2 coordinates (dp=2 x tp=2), got 1")));
    EXPECT_THAT([&] { mesh.rank_of({0, 2}); },
                ThrowsMessage<std::invalid_argument>(HasSubstr("coordinate 2 of 'tp' outside [0, 2)")));
    EXPECT_THAT([&] { mesh.coordinates_of(4); },
                ThrowsMessage<std::invalid_argument>(HasSubstr("coordinates_of(4): outside the world's [0, 4)")));
    // Nothing above communicated: the groups still pair up.
    EXPECT_DOUBLE_EQ(sum_of_ranks(mesh.group("dp"), world->rank()), world->rank() % 2 == 0 ? 4 : 6);
  });
  EXPECT_EQ(errors, std::vector<std::string>(4, ""));
}

TEST(ProcessMesh, DifferentDimsAcrossRanksThrowOnEveryRank) {
  std::vector<std::string> messages(4);
  auto errors = run_thread_ranks(4, [&](const Group& world) {
    const int wr = world->rank();
    std::vector<ProcessMesh::Dim> dims{{"dp", 2}, {"tp", 2}};
    if (wr == 3) std::swap(dims[0], dims[1]);
    try {
      ProcessMesh mesh(world, dims);
    } catch (const DistError& e) {
      messages[wr] = e.what();
    }
  });
  EXPECT_EQ(errors, std::vector<std::string>(4, ""));
  for (int r = 0; r < 4; ++r)
    EXPECT_THAT(messages[r], AllOf(HasSubstr("ProcessMesh: the ranks passed different dims"),
                                   HasSubstr("rank 0 dp=2 x tp=2, rank 3 tp=2 x dp=2")))
        << "rank " << r;
}

}  // namespace

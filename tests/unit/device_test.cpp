// device_test.cpp — booster/device.h on the CPU: select_device's answers and errors for "cpu", the
// host-copy helpers (a CPU tensor is already host memory: returned as it is), and StreamEvent on a
// CPU device (complete at once; record and synchronize do nothing). The CUDA side of each (pinned
// copies, CUDA events ordering a stream) is tested in tests/gpu/gpu_checkpoint_test.cpp and
// gpu_sharded_test.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>
#include <utility>

#include "booster/device.h"

namespace device_test {

using ::testing::HasSubstr;

TEST(Device, SelectCpuAndItsErrors) {
  EXPECT_EQ(booster::select_device("cpu", 0, 1, "gloo"), c10::Device(c10::kCPU));
  try {
    booster::select_device("tpu", 0, 1, "gloo");
    FAIL() << "an unknown device name was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("tpu"));
  }
  try {
    booster::select_device("cpu", 0, 1, "nccl");
    FAIL() << "nccl on the CPU was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("nccl"));
  }
}

TEST(Device, HostCopiesOfCpuTensorsAreTheTensorsThemselves) {
  const at::Tensor t = torch::arange(6, torch::kFloat).reshape({2, 3});
  EXPECT_EQ(booster::pinned_host_copy(t).data_ptr(), t.data_ptr());
  EXPECT_EQ(booster::pinned_host_copy_async(t).data_ptr(), t.data_ptr());
  EXPECT_FALSE(booster::pinned_host_copy(at::Tensor()).defined());
  EXPECT_FALSE(booster::pinned_host_copy_async(at::Tensor()).defined());
  const auto memory = booster::device_memory(c10::Device(c10::kCPU));
  EXPECT_EQ(memory.allocated, 0);
  EXPECT_EQ(memory.total, 0);
}

TEST(Device, StreamEventOnTheCpuIsCompleteAtOnce) {
  booster::StreamEvent event(c10::Device(c10::kCPU));
  EXPECT_TRUE(event.query());  // never recorded
  event.synchronize();
  at::Tensor x = torch::ones({1000});
  x.mul_(3);
  event.record();
  EXPECT_TRUE(event.query());
  event.synchronize();
  EXPECT_FLOAT_EQ(x[999].item<float>(), 3.0f);
  booster::StreamEvent moved(std::move(event));
  EXPECT_TRUE(moved.query());
  EXPECT_EQ(moved.device(), c10::Device(c10::kCPU));
}

}  // namespace device_test

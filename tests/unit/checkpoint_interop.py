#!/usr/bin/env python3
"""Python side of the checkpoint interop tests (tests/unit/state_dict_io_test.cpp), run with a
python that has torch 2.11 (the venv's python3, BOOSTER_PYTHON).

  read_ours <dir> <out.bin> [base]
      Loads a pytorch_model*.bin checkpoint written by Booster C++ the way transformers does (the
      index's weight_map, each shard with torch.load, checking each shard holds exactly the names the
      index maps to it), then torch.save()s a plain dict of fresh copies of every tensor, in the
      order read, to <out.bin> for the C++ side to compare bit-exactly. Prints a JSON summary
      {"files": [...], "tensors": {name: {"dtype", "shape", "hex"}}}.

  check_index <index.json>...
      Checks each file is byte-identical to json.dumps(json.load(f), indent=2, sort_keys=True) + "\\n"
      (what transformers writes) and that total_size is an int. Prints "ok".

  write_ref <dir>
      Writes Python-made checkpoints for the C++ reader: <dir>/single/pytorch_model.bin (a plain
      dict), <dir>/sharded/pytorch_model-0000{1,2}-of-00002.bin + pytorch_model.bin.index.json (as
      transformers shards), <dir>/ordered.bin (an OrderedDict, i.e. torch.save(model.state_dict())),
      and <dir>/expected.json: {name: {"dtype", "shape", "hex"}} where hex is the C-order bytes.

  write_pickles <dir> <marker>
      Writes the restricted unpickler's cases (tests/unit/torch_unpickler_test.cpp): a state_dict()
      OrderedDict, a one-tensor dict, every dtype, views of one storage, nested dicts with non-tensor
      values, a sharded checkpoint with a tensor alone in its shard; and hostile or broken archives:
      os.system / builtins.eval globals (they would create <marker>), a truncated pickle, a missing
      or short storage record, 5000 nested lists, a view outside its storage, the legacy format, a
      list at the top. <dir>/expected.json: {file: {"order", "tensors": {name: describe}}}.
"""
import collections
import json
import os
import sys

import torch


def raw_hex(t):
    t = t.detach().contiguous()
    if t.numel() == 0:
        return ""
    return t.reshape(-1).view(torch.uint8).numpy().tobytes().hex()


def describe(t):
    return {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape), "hex": raw_hex(t)}


def read_ours(path, out, base="model"):
    stem = "pytorch_model" if base == "model" else base
    index_path = os.path.join(path, stem + ".bin.index.json")
    tensors = collections.OrderedDict()
    files = []
    if os.path.exists(index_path):
        with open(index_path) as f:
            index = json.load(f)
        assert isinstance(index["metadata"]["total_size"], int), index["metadata"]
        by_file = collections.OrderedDict()
        for name, file in index["weight_map"].items():
            by_file.setdefault(file, []).append(name)
        total = 0
        for file in sorted(by_file):
            shard = torch.load(os.path.join(path, file), weights_only=True)
            assert type(shard) is dict, type(shard)
            assert sorted(shard.keys()) == sorted(by_file[file]), (file, list(shard.keys()), by_file[file])
            files.append(file)
            for name, t in shard.items():
                tensors[name] = t
                total += t.numel() * t.element_size()
        assert total == index["metadata"]["total_size"], (total, index["metadata"])
    else:
        file = stem + ".bin"
        shard = torch.load(os.path.join(path, file), weights_only=True)
        assert type(shard) is dict, type(shard)
        files.append(file)
        tensors.update(shard)
    for name, t in tensors.items():
        assert isinstance(t, torch.Tensor), (name, type(t))
        assert not t.requires_grad, name
    torch.save({name: t.clone() for name, t in tensors.items()}, out)
    print(json.dumps({"files": files, "tensors": {n: describe(t) for n, t in tensors.items()}}))


def check_index(paths):
    for path in paths:
        check_one_index(path)
    print("ok")


def check_one_index(path):
    with open(path) as f:
        text = f.read()
    index = json.loads(text)
    expected = json.dumps(index, indent=2, sort_keys=True) + "\n"
    if text != expected:
        print("index differs from json.dumps(indent=2, sort_keys=True):\n" + text + "\n---\n" + expected)
        sys.exit(1)
    assert isinstance(index["metadata"]["total_size"], int)


def reference_tensors():
    n = 37
    ar = torch.arange(n, dtype=torch.float64)
    special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-300, -2.5, 65504.0, 1e-8])
    base = torch.cat([ar * 0.37 - 5.1, special.double()])
    t = collections.OrderedDict()
    t["f64"] = (base * 1.000001).reshape(2, -1)
    t["f32"] = base.float().reshape(-1, 2)
    t["f16"] = base.half()
    t["bf16"] = base.bfloat16().reshape(1, 2, -1)
    t["i64"] = torch.tensor([-(2 ** 63), 2 ** 63 - 1, 0, -1, 123456789012345], dtype=torch.int64)
    t["i32"] = (torch.arange(24, dtype=torch.int32) * -99991).reshape(2, 3, 4)
    t["i16"] = torch.tensor([-32768, 32767, 0, -1, 1234], dtype=torch.int16)
    t["i8"] = torch.tensor([-128, 127, 0, -1, 42], dtype=torch.int8)
    t["u8"] = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    t["bool"] = torch.tensor([True, False, False, True, True])
    t["scalar"] = torch.tensor(3.25)
    t["empty"] = torch.zeros(0, 3)
    big = torch.arange(60, dtype=torch.float32).reshape(6, 10)
    t["transposed"] = big.t()           # non-contiguous
    t["slice_a"] = big[1:3]             # views sharing one storage, with offsets
    t["slice_b"] = big[4:, 2:5]
    return t


def write_ref(out):
    t = reference_tensors()
    os.makedirs(os.path.join(out, "single"), exist_ok=True)
    os.makedirs(os.path.join(out, "sharded"), exist_ok=True)
    torch.save(dict(t), os.path.join(out, "single", "pytorch_model.bin"))
    names = list(t.keys())
    halves = [names[: len(names) // 2], names[len(names) // 2:]]
    weight_map = {}
    total = 0
    for i, part in enumerate(halves):
        file = "pytorch_model-%05d-of-%05d.bin" % (i + 1, len(halves))
        torch.save({n: t[n] for n in part}, os.path.join(out, "sharded", file))
        for n in part:
            weight_map[n] = file
            total += t[n].numel() * t[n].element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with open(os.path.join(out, "sharded", "pytorch_model.bin.index.json"), "w") as f:
        f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
    torch.save(collections.OrderedDict(t), os.path.join(out, "ordered.bin"))
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump({"order": names, "tensors": {n: describe(v) for n, v in t.items()}}, f)
    print("ok")


def raw_hex_any(t):
    """C-order bytes of any dtype (complex through numpy, which views it as bytes)."""
    t = t.detach().contiguous()
    if t.numel() == 0:
        return ""
    if t.is_complex():
        return t.numpy().tobytes().hex()
    return raw_hex(t)


def _zip_with(src, dst, replace=None, drop=()):
    """Copies the zip archive src to dst, replacing records (name suffix -> bytes) and dropping some."""
    import zipfile
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            if any(info.filename.endswith(d) for d in drop):
                continue
            data = zin.read(info.filename)
            for suffix, new in (replace or {}).items():
                if info.filename.endswith(suffix):
                    data = new
            zout.writestr(info.filename, data)


class _Evil:
    def __init__(self, fn, arg):
        self.fn, self.arg = fn, arg

    def __reduce__(self):
        return (self.fn, (self.arg,))


class _Outside:
    def __init__(self, storage):
        self.storage = storage

    def __reduce__(self):
        return (torch._utils._rebuild_tensor_v2, (self.storage, 100, (10,), (1,), False, collections.OrderedDict()))


def write_pickles(out, marker):
    """The restricted unpickler's cases (tests/unit/torch_unpickler_test.cpp): files Python's torch.save
    writes for state dicts, and hostile or broken ones. expected.json: {file: {name: describe}}."""
    import pickle
    torch.manual_seed(0)
    expected = {}

    def save(name, obj, flat):
        torch.save(obj, os.path.join(out, name))
        expected[name] = {"order": list(flat.keys()),
                          "tensors": {n: {"dtype": str(v.dtype).replace("torch.", ""), "shape": list(v.shape),
                                          "hex": raw_hex_any(v)} for n, v in flat.items()}}

    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    net(torch.randn(5, 3))  # running statistics move, num_batches_tracked = 1
    sd = net.state_dict()
    save("state_dict.bin", sd, dict(sd))  # an OrderedDict with _metadata
    save("single.bin", {"only": torch.arange(6.0).reshape(2, 3)}, {"only": torch.arange(6.0).reshape(2, 3)})
    dtypes = {}
    for dt in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
               torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128):
        base = torch.arange(-3, 4)
        v = (base % 2 == 0) if dt == torch.bool else (base.abs() if dt == torch.uint8 else base).to(dt)
        if dt.is_floating_point:
            v = v / 3
        if dt.is_complex:
            v = torch.complex(base.double() / 3, -base.double()).to(dt)
        dtypes[str(dt).replace("torch.", "")] = v
    save("dtypes.bin", dtypes, dtypes)
    base = torch.arange(24.0)
    views = {"base": base, "slice": base[2:10], "transposed": base.view(4, 6).t(), "strided": base[::3],
             "scalar": torch.tensor(7.5), "empty": torch.zeros(0, 3)}
    save("views.bin", views, views)
    w = torch.randn(3, 2)
    nested = {"model": {"fc.weight": w, "fc.bias": torch.ones(3)}, "step": 3, "name": "run", "lr": 0.5, "none": None,
              "optimizer": {"state": {0: {"exp_avg": torch.full((2,), 0.25)}}}}
    save("nested.bin", nested, {"model.fc.weight": w, "model.fc.bias": torch.ones(3),
                                "optimizer.state.0.exp_avg": torch.full((2,), 0.25)})
    # A HuggingFace-style sharded checkpoint whose oversized tensor sits alone in its shard.
    os.makedirs(os.path.join(out, "alone"), exist_ok=True)
    big, small = torch.randn(64, 64), {"a": torch.randn(3), "b": torch.randn(2, 2)}
    torch.save({"big": big}, os.path.join(out, "alone", "pytorch_model-00001-of-00002.bin"))
    torch.save(small, os.path.join(out, "alone", "pytorch_model-00002-of-00002.bin"))
    weight_map = {"big": "pytorch_model-00001-of-00002.bin", "a": "pytorch_model-00002-of-00002.bin",
                  "b": "pytorch_model-00002-of-00002.bin"}
    total = sum(t.numel() * t.element_size() for t in [big, *small.values()])
    with open(os.path.join(out, "alone", "pytorch_model.bin.index.json"), "w") as f:
        f.write(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2, sort_keys=True) + "\n")
    expected["alone"] = {"order": ["big", "a", "b"],
                         "tensors": {n: describe(v) for n, v in {"big": big, **small}.items()}}
    # Hostile and broken files, made from single.bin.
    src = os.path.join(out, "single.bin")
    import posix
    _zip_with(src, os.path.join(out, "evil_global.bin"),
              {"data.pkl": pickle.dumps({"x": _Evil(posix.system, "touch " + marker)}, protocol=2)})
    import builtins
    _zip_with(src, os.path.join(out, "evil_stack_global.bin"),
              {"data.pkl": pickle.dumps({"x": _Evil(builtins.eval, "open(%r, 'w')" % marker)}, protocol=4)})
    _zip_with(src, os.path.join(out, "truncated.bin"), {"data.pkl": pickle.dumps({"a": 1}, protocol=2)[:-5]})
    _zip_with(src, os.path.join(out, "missing_storage.bin"), drop=("data/0",))
    _zip_with(src, os.path.join(out, "short_storage.bin"), {"data/0": b"\0" * 20})
    deep = b"\x80\x02" + b"]" * 5000 + b"a" * 4999 + b"."
    _zip_with(src, os.path.join(out, "deep.bin"), {"data.pkl": deep})
    torch.save({"x": _Outside(torch.arange(4.0).storage())}, os.path.join(out, "outside.bin"))
    torch.save(sd, os.path.join(out, "legacy.bin"), _use_new_zipfile_serialization=False)
    torch.save([torch.ones(2)], os.path.join(out, "list.bin"))
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f)
    print("ok")


def main():
    cmd = sys.argv[1]
    if cmd == "read_ours":
        read_ours(*sys.argv[2:])
    elif cmd == "check_index":
        check_index(sys.argv[2:])
    elif cmd == "write_ref":
        write_ref(sys.argv[2])
    elif cmd == "write_pickles":
        write_pickles(sys.argv[2], sys.argv[3])
    else:
        sys.exit("unknown command " + cmd)


if __name__ == "__main__":
    main()

"""Benchmark: coremltools' default pass pipeline against `rewrite.mil.build_pass_pipeline()` on
transformers models converted with coremltools' own PyTorch frontend.

Each model is a `transformers` model with 2 layers, width 64 and random
weights (every parameter drawn afresh, norms' gains around 1, so no weight is
all ones or zeros), traced with `torch.jit.trace` and converted with
`ct.convert(..., convert_to="milinternal", minimum_deployment_target=iOS18)`:

* gpt2:   GPT2Model, input_ids (1, S);
* llama:  LlamaModel with grouped-query attention (4 heads, 2 key/value heads), input_ids (1, S);
* bert:   BertModel, input_ids and an attention_mask (1, S);
* vit:    ViTModel (32x32 images, 8x8 patches), pixel_values (B, 3, 32, 32).

each with transformers' default attention (`sdpa`) and with `eager`
attention (`-eager`), once with a static shape and once flexible: a
`ct.RangeDim(1, 64, default=8)` sequence S, and for ViT (whose sequence is
fixed by the image size; coremltools cannot convert the bicubic
interpolation a flexible image needs) a `ct.RangeDim(1, 4, default=1)` batch B.

For each model and shape the table gives the op count (non-const ops, as
bench/parity_stablehlo.py counts them; consts are listed apart) under the
default pipeline and under ours, and the conversion time under each
(`ct.convert` alone, the model traced beforehand; the best of `--repeat`
runs). With `--check-values` each program is also evaluated with the
project's reference evaluator and compared with torch (rtol 1e-3, fp32; flexible
models at two sequence lengths).

Targets (printed at the end): no model bigger under our pipeline than under
the default one; the total at least 10% smaller; each flexible model within
10% of its static twin's op count under our pipeline.

Measured with transformers 5 (5.24): two gaps of coremltools 9's torch frontend are
bridged as a user would (`register_new_ones`, and Llama's key/value heads repeated by
transformers rather than passed to SDPA with enable_gqa, which the frontend ignores).
transformers 4.57 traces GPT-2 with its sequence length baked into a reshape, so its
flexible programs fail at other lengths under either pipeline.

With `--apply`, `rewrite apply` also runs as a process on each model's raw
`.mlpackage` (saved with PassPipeline.EMPTY): the output must keep the input
spec and compute what torch does; the table gives its op count (the raw
program and our rules alone, no coremltools pass) and its time.

Without `transformers` installed the script says so and exits 0.

Usage:
    python bench/bench_torch_models.py [--models gpt2,llama-eager,...] [--repeat N]
                                       [--fp16] [--check-values] [--histograms] [--apply]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

logging.getLogger("coremltools").setLevel(logging.CRITICAL)
warnings.filterwarnings("ignore")

import numpy as np  # noqa: E402

WIDTH, LAYERS, HEADS = 64, 2, 4
LENGTH = 8  # the static sequence, and the RangeDim's default
CHECK_LENGTHS = (5, 11)  # where flexible models are evaluated
RTOL, ATOL = 1e-3, 1e-4


@dataclass(frozen=True)
class Spec:
    name: str
    family: str  # gpt2 | llama | bert | vit
    attention: str  # transformers' attn_implementation


FAMILIES = ("gpt2", "llama", "bert", "vit")
SPECS = tuple(
    Spec(family + ("" if attention == "sdpa" else "-eager"), family, attention)
    for family in FAMILIES
    for attention in ("sdpa", "eager")
)


def register_new_ones() -> None:
    """`Tensor.new_ones`, which transformers 5's BERT calls and coremltools 9's torch
    frontend has no converter for: a fill of ones, of the given dtype or else the
    tensor's own (torch's default), as coremltools converts `new_zeros`."""
    from coremltools.converters.mil.frontend.torch import ops
    from coremltools.converters.mil.frontend.torch.torch_op_registry import register_torch_op
    from coremltools.converters.mil.frontend.torch.utils import NUM_TO_NUMPY_DTYPE
    from coremltools.converters.mil.mil import Builder as mb
    from coremltools.converters.mil.mil import types
    from coremltools.converters.mil.mil.types import nptype_from_builtin

    if "new_ones" in ops._TORCH_OPS_REGISTRY:
        return

    @register_torch_op
    def new_ones(context, node):
        inputs = ops._get_inputs(context, node)
        shape = inputs[1]
        if isinstance(shape, list):
            shape = mb.concat(values=shape, axis=0)
        if shape.dtype != types.int32:
            shape = mb.cast(x=shape, dtype="int32")
        given = inputs[2] if len(inputs) > 2 else None
        if given is not None and given.val is not None:
            dtype = NUM_TO_NUMPY_DTYPE[int(given.val)]
        else:
            dtype = nptype_from_builtin(inputs[0].dtype)
        context.add(mb.fill(shape=shape, value=np.array(1, dtype=dtype), name=node.name))


def build_model(spec: Spec):
    """The transformers model of `spec`, random weights, in eval mode, wrapped to return the last hidden state."""
    import torch
    import transformers

    common = dict(attn_implementation=spec.attention)
    if spec.family == "gpt2":
        config = transformers.GPT2Config(
            n_embd=WIDTH, n_layer=LAYERS, n_head=HEADS, n_positions=128, vocab_size=100, **common
        )
        model = transformers.GPT2Model(config)
    elif spec.family == "llama":
        config = transformers.LlamaConfig(
            hidden_size=WIDTH, intermediate_size=2 * WIDTH, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
            num_key_value_heads=HEADS // 2, vocab_size=100, max_position_embeddings=128, **common,
        )
        model = transformers.LlamaModel(config)
    elif spec.family == "bert":
        config = transformers.BertConfig(
            hidden_size=WIDTH, intermediate_size=2 * WIDTH, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
            vocab_size=100, max_position_embeddings=128, **common,
        )
        model = transformers.BertModel(config, add_pooling_layer=False)
    else:
        config = transformers.ViTConfig(
            hidden_size=WIDTH, intermediate_size=2 * WIDTH, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
            image_size=32, patch_size=8, **common,
        )
        model = transformers.ViTModel(config, add_pooling_layer=False)

    if spec.family == "llama" and spec.attention == "sdpa":
        # transformers 5 hands torch's SDPA the key/value heads unrepeated, with
        # enable_gqa=True, which coremltools 9's torch frontend ignores (its
        # matmul then fails on 4 query heads against 2). Repeating the heads in
        # transformers, as it does for a mask, is how such a model converts today.
        import transformers.integrations.sdpa_attention as sdpa_attention

        sdpa_attention.use_gqa_in_sdpa = lambda *args, **kwargs: False

    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            fresh = torch.randn(parameter.shape, generator=generator) * 0.2
            gain = name.endswith("weight") and parameter.dim() == 1 and "embed" not in name
            parameter.copy_(fresh + 1.0 if gain else fresh)

    class LastHidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x, mask=None):
            if spec.family == "vit":
                return self.model(pixel_values=x, return_dict=False)[0]
            if spec.family == "bert":
                return self.model(input_ids=x, attention_mask=mask, return_dict=False)[0]
            return self.model(input_ids=x, return_dict=False)[0]

    return LastHidden().eval()


def example_inputs(spec: Spec, size: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    """Inputs with the flexible axis (sequence, or ViT's batch) at `size`."""
    rng = np.random.default_rng(seed)
    if spec.family == "vit":
        return (rng.standard_normal((size, 3, 32, 32)).astype(np.float32),)
    ids = rng.integers(0, 100, size=(1, size)).astype(np.int32)
    if spec.family != "bert":
        return (ids,)
    mask = np.ones((1, size), dtype=np.int32)
    mask[0, size - max(1, size // 3):] = 0  # padding at the end
    return ids, mask


def input_types(spec: Spec, flexible: bool):
    import coremltools as ct

    if spec.family == "vit":
        batch = ct.RangeDim(1, 4, default=1) if flexible else 1
        return [ct.TensorType(name="x", shape=(batch, 3, 32, 32))]
    length = ct.RangeDim(1, 64, default=LENGTH) if flexible else LENGTH
    types = [ct.TensorType(name="x", shape=(1, length), dtype=np.int32)]
    if spec.family == "bert":
        types.append(ct.TensorType(name="mask", shape=(1, length), dtype=np.int32))
    return types


def trace(spec: Spec, module):
    import torch

    size = 1 if spec.family == "vit" else LENGTH
    tensors = [torch.from_numpy(a).long() if a.dtype == np.int32 else torch.from_numpy(a)
               for a in example_inputs(spec, size)]
    return torch.jit.trace(module, tuple(tensors))


def convert(traced, spec: Spec, flexible: bool, pipeline, fp16: bool):
    import coremltools as ct

    return ct.convert(
        traced,
        inputs=input_types(spec, flexible),
        convert_to="milinternal",
        minimum_deployment_target=ct.target.iOS18,
        compute_precision=ct.precision.FLOAT16 if fp16 else ct.precision.FLOAT32,
        pass_pipeline=pipeline,
    )


def histogram(program) -> Counter:
    counts: Counter = Counter()
    pending = list(program.functions.values())
    while pending:
        block = pending.pop()
        for op in block.operations:
            counts[op.op_type] += 1
            pending.extend(op.blocks)
    return counts


def agrees_with_torch(spec: Spec, module, program, flexible: bool) -> bool:
    import torch

    from rewrite.backends.mil.reference import evaluate

    sizes = CHECK_LENGTHS if flexible else ((1,) if spec.family == "vit" else (LENGTH,))
    if flexible and spec.family == "vit":
        sizes = (2, 3)
    for seed, size in enumerate(sizes, start=1):
        arrays = example_inputs(spec, size, seed)
        tensors = [torch.from_numpy(a).long() if a.dtype == np.int32 else torch.from_numpy(a) for a in arrays]
        with torch.no_grad():
            want = module(*tensors).numpy()
        feeds = dict(zip(["x", "mask"], arrays))
        try:
            (got,) = evaluate(program, feeds).values()
        except ValueError:  # the program's own type inference rejects it at this size
            return False
        if got.shape != want.shape or not np.allclose(got, want, rtol=RTOL, atol=ATOL):
            return False
    return True


def applied_to_raw_package(traced, spec: Spec, module, flexible: bool, fp16: bool) -> tuple[str, int | None, float]:
    """`rewrite apply` (a process, as a user runs it) on the model's raw `.mlpackage` (saved
    with PassPipeline.EMPTY): ("ok" or what failed, non-const ops after, seconds). Checks that
    the output keeps the input spec (names, dtypes, ranges, defaults) and computes what torch
    does (as --check-values)."""
    import subprocess
    import tempfile

    import coremltools as ct

    from rewrite.backends.mil.files import load_mlpackage

    with tempfile.TemporaryDirectory() as folder:
        raw, out = Path(folder) / "raw.mlpackage", Path(folder) / "out.mlpackage"
        ct.convert(
            traced, inputs=input_types(spec, flexible), convert_to="mlprogram",
            minimum_deployment_target=ct.target.iOS18, pass_pipeline=ct.PassPipeline.EMPTY, skip_model_load=True,
            compute_precision=ct.precision.FLOAT16 if fp16 else ct.precision.FLOAT32,
        ).save(str(raw))
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "rewrite.cli", "apply", str(raw), "-o", str(out)],
                              capture_output=True, text=True, cwd=REPO)
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            return f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}", None, seconds
        _, raw_source = load_mlpackage(raw)
        program, source = load_mlpackage(out)
        if list(source.spec.description.input) != list(raw_source.spec.description.input):
            return "input spec changed", None, seconds
        ops = histogram(program)
        ops.pop("const", 0)
        if not agrees_with_torch(spec, module, program, flexible):
            return "DIFFER", sum(ops.values()), seconds
        return "ok", sum(ops.values()), seconds


def timed_convert(traced, spec, flexible, pipeline, fp16, repeat):
    best, program = None, None
    for _ in range(repeat):
        start = time.perf_counter()
        program = convert(traced, spec, flexible, pipeline, fp16)
        elapsed = time.perf_counter() - start
        best = elapsed if best is None else min(best, elapsed)
    return program, best


def print_table(header, rows):
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    line = "  ".join(f"{{:{'<' if i < 2 else '>'}{w}}}" for i, w in enumerate(widths))
    print(line.format(*header))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print(line.format(*row))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", help="comma-separated names (default: all): " + ",".join(s.name for s in SPECS))
    parser.add_argument("--repeat", type=int, default=1, help="conversions per pipeline; the best time counts")
    parser.add_argument("--fp16", action="store_true", help="compute_precision FLOAT16 (default FLOAT32)")
    parser.add_argument("--check-values", action="store_true", help="compare each program with torch")
    parser.add_argument("--histograms", action="store_true", help="print what differs, op type by op type")
    parser.add_argument("--apply", action="store_true",
                        help="also run `rewrite apply` on each raw .mlpackage: ops, input spec, values, time")
    args = parser.parse_args(argv)

    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as missing:
        print(f"skipped: {missing.name} is not installed (pip install torch transformers)")
        return 0

    import coremltools as ct

    from rewrite.mil import build_pass_pipeline

    register_new_ones()
    known = {spec.name: spec for spec in SPECS}
    names = args.models.split(",") if args.models else list(known)
    unknown = [name for name in names if name not in known]
    if unknown:
        parser.error(f"unknown model(s): {', '.join(unknown)}")

    pipelines = (("default", ct.PassPipeline.DEFAULT), ("ours", build_pass_pipeline()))
    header = ["model", "shape", "default", "ours", "change", "consts d/o", "time default", "time ours"]
    if args.check_values:
        header.append("values d/o")
    if args.apply:
        header.extend(["apply", "apply ops", "apply time"])
    rows, results, notes = [], {}, []
    for name in names:
        spec = known[name]
        module = build_model(spec)
        traced = trace(spec, module)
        for flexible in (False, True):
            shape = "flexible" if flexible else "static"
            counts, consts, times, values = {}, {}, {}, {}
            for label, pipeline in pipelines:
                program, seconds = timed_convert(traced, spec, flexible, pipeline, args.fp16, args.repeat)
                ops = histogram(program)
                consts[label] = ops.pop("const", 0)
                counts[label] = ops
                times[label] = seconds
                if args.check_values:
                    values[label] = "ok" if agrees_with_torch(spec, module, program, flexible) else "DIFFER"
            default, ours = sum(counts["default"].values()), sum(counts["ours"].values())
            results[name, flexible] = (default, ours)
            row = [name, shape, default, ours, f"{(ours - default) / default:+.0%}",
                   f"{consts['default']}/{consts['ours']}", f"{times['default']:.2f}s", f"{times['ours']:.2f}s"]
            if args.check_values:
                row.append(f"{values['default']}/{values['ours']}")
            if args.apply:
                verdict, applied, seconds = applied_to_raw_package(traced, spec, module, flexible, args.fp16)
                row.extend([verdict, "-" if applied is None else applied, f"{seconds:.2f}s"])
            rows.append(row)
            if args.histograms:
                only_default = counts["default"] - counts["ours"]
                only_ours = counts["ours"] - counts["default"]
                notes.append(f"{name} [{shape}] default - ours: {dict(sorted(only_default.items()))}; "
                             f"ours - default: {dict(sorted(only_ours.items()))}")

    print(f"Non-const ops (consts apart), {'fp16' if args.fp16 else 'fp32'}, iOS18, torch.jit.trace + ct.convert.")
    print_table(header, rows)
    for note in notes:
        print(note)

    total_default = sum(d for d, _ in results.values())
    total_ours = sum(o for _, o in results.values())
    bigger = [f"{name} {'flexible' if flexible else 'static'}" for (name, flexible), (d, o) in results.items() if o > d]
    print()
    print(f"total: default {total_default}, ours {total_ours} ({(total_ours - total_default) / total_default:+.1%})")
    print(f"no model bigger than under the default pipeline: {'yes' if not bigger else 'NO: ' + ', '.join(bigger)}")
    print(f"total at least 10% smaller: {'yes' if total_ours <= 0.9 * total_default else 'NO'}")
    for name in names:
        if (name, False) in results and (name, True) in results:
            static, flexible = results[name, False][1], results[name, True][1]
            verdict = "yes" if flexible <= 1.1 * static else "NO"
            ratio = flexible / static
            print(f"{name}: flexible {flexible} against static {static} ({ratio:.2f}x), within 10%: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

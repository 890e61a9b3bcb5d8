"""Stand-in for Hugging Face `datasets`, which the GPU machine lacks (no network, and its wheels
with pyarrow exceed a device call's carry). SGLang 0.5.12 imports `load_dataset` at module level in
`sglang.benchmark.datasets.mmmu` (reached from `bench_serving` and `sglang.test.test_utils`); the
harness's runs (bench_serving's random-ids, the generated fork GPU test) never load a dataset, and
a run that tried would stop here."""


def load_dataset(*args, **kwargs):
    raise RuntimeError("datasets is not installed on this machine (benchmark/gpu/standin)")

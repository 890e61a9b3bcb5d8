"""What the generated GPU test would do on a GPU, read without one (in the proof venv).

    VENV/bin/python run_on_cpu.py gpu_test_probe.py GENERATED_TEST MODELS_DIR

Imports the generated file (not as __main__, so no test runs), parses each configuration's
server command with SGLang's own ``ServerArgs`` argument parser, builds the models with the
file's embedded builder into MODELS_DIR and lists its request plan. Prints one line,
``GPU-TEST-PROBE {json}``.
"""

import argparse
import importlib.util
import json
import sys

from sglang.srt.server_args import ServerArgs

#: ServerArgs fields the test's commands set
FIELDS = (
    "model_path",
    "port",
    "host",
    "tensor_parallel_size",
    "mem_fraction_static",
    "max_total_tokens",
    "skip_server_warmup",
    "grammar_backend",
    "max_running_requests",
    "attention_backend",
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "disable_cuda_graph",
    "cuda_graph_max_bs",
)


def main(generated: str, models: str) -> None:
    spec = importlib.util.spec_from_file_location("generated_gpu_test", generated)
    test = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(test)
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    commands = {}
    for name, config in test.CONFIGS.items():
        command = test.server_command(models, 30000, *config)
        args = parser.parse_args(command[3:])
        commands[name] = {"argv0": command[:3], **{f: getattr(args, f) for f in FIELDS}}
    _tokenizer, prompts = test.build_models(models)
    plan = [{"tag": tag, "texts": texts, "rules": rules} for tag, texts, rules in test.request_plan(prompts)]
    new_tokens = {name: test.new_tokens(config[3]) for name, config in test.CONFIGS.items()}
    print(
        "GPU-TEST-PROBE "
        + json.dumps(
            {
                "configs": {name: list(config) for name, config in test.CONFIGS.items()},
                "commands": commands,
                "plan": plan,
                "new_tokens": new_tokens,
                "near_context_tokens": prompts["n_tokens"]["long_1900"],
                "context": test.CTX,
            }
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:])

"""What sglang needs on a CPU: the stand-ins, and the trainer worker's side of verl's weight push."""

import subprocess
import sys
import textwrap


from sglang_required import require_sglang

require_sglang()


def run_python(code: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout)


def test_vllm_stand_in_hands_back_sglangs_own_layers():
    proc = run_python("""
        from egpo.rollout.sglang.standins import prepare_sglang_import
        assert prepare_sglang_import()  # a CPU machine without sgl_kernel
        import sglang.srt.layers.activation as act, sglang.srt.layers.layernorm as norm
        import vllm.model_executor.layers.activation as vact, vllm.model_executor.layers.layernorm as vnorm
        for ours, theirs, names in ((act, vact, ("SiluAndMul", "GeluAndMul")), (norm, vnorm, ("RMSNorm", "GemmaRMSNorm"))):
            for name in names:
                cls = getattr(ours, name)
                assert cls is getattr(theirs, name) and cls.__module__ == ours.__name__, (name, cls)
        import vllm._custom_ops as ops
        try:
            ops.rotary_embedding(1, 2)
        except RuntimeError as err:
            assert "needs CUDA" in str(err)
        else:
            raise AssertionError("a vllm kernel stand-in ran")
        try:
            import vllm.logger
        except ImportError:
            pass
        else:
            raise AssertionError("vllm.logger must stay absent (sglang treats that as 'no vLLM')")
        print("ok")
    """)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


def test_stand_ins_stay_off_where_cuda_is_available():
    proc = run_python("""
        import sys, torch
        from egpo.rollout.sglang.standins import prepare_sglang_import
        torch.cuda.is_available = lambda: True
        assert prepare_sglang_import() is False
        assert not any(type(f).__name__ == "_StandInFinder" for f in sys.meta_path)
        print("ok")
    """)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


WEIGHT_PUSH = """
    import base64, subprocess, sys, torch
    {prepare}
    from egpo.rollout.sglang.standins import prepare_sglang_import
    prepare_sglang_import()
    from sglang.srt.utils import MultiprocessingSerializer
    from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
    monkey_patch_torch_reductions()  # what sglang's update_weights does before serializing
    weight = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    blob = base64.b64encode(MultiprocessingSerializer.serialize(weight)).decode()
    # another process, as sglang's scheduler is: rebuild the tensor the way update_weights_from_tensor does
    child = subprocess.run([sys.executable, "-c", (
        "import base64, sys\\n"
        "from egpo.rollout.sglang.standins import prepare_sglang_import; prepare_sglang_import()\\n"
        "from sglang.srt.utils import MultiprocessingSerializer\\n"
        "print(MultiprocessingSerializer.deserialize(base64.b64decode(sys.stdin.read())).sum().item())")],
        input=blob, capture_output=True, text=True, timeout=120)
    print("received", child.stdout.strip(), child.stderr[-300:])
"""


def test_weight_push_from_a_cpu_trainer_worker_reaches_another_process():
    proc = run_python(WEIGHT_PUSH.format(prepare="from egpo.cpu.sglang_rollout import prepare_worker_for_sglang; "
                                                 "prepare_worker_for_sglang()"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "received 66.0" in proc.stdout, proc.stdout


def test_without_the_worker_preparation_the_push_fails():
    """The reason for egpo/cpu/sglang_rollout.py: sglang's reducer patch, or the fd handover, breaks on a CPU."""
    proc = run_python(WEIGHT_PUSH.format(prepare=""))
    assert "received 66.0" not in proc.stdout
    assert "IndexError" in proc.stderr + proc.stdout or "AuthenticationError" in proc.stderr + proc.stdout

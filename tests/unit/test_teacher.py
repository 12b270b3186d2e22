"""One teacher concept (``vocagno.teacher.teacher.Teacher``) serves training, the scoring pass and the report: what it
reads, where its losses go, what it records, on the shipped tokenizers and the shipped tiny teacher."""

import socket

import pytest
import torch
from omegaconf import OmegaConf as om

from vocagno.algorithms.baselines import KLD
from vocagno.algorithms.vocagno_lm import VocAgnoLM
from vocagno.core.loss import CHUNK_SIZE
from vocagno.data.shards import ShardMetadata, describe_tokenizer
from vocagno.errors import Refused
from vocagno.teacher.several import Teachers, reader_first, teachers_from
from vocagno.teacher.teacher import Teacher

TINY = {"model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 128}


@pytest.fixture(scope="module")
def metadata(tokenizers):
    """Shards of llama2 student tokens and mistral teacher tokens (as the converter records them)."""
    return ShardMetadata(describe_tokenizer(tokenizers["llama2"], "student"),
                         describe_tokenizer(tokenizers["mistral"], "teacher"), seq_len=64)


def qwen(tokenizers, **fields):
    return Teacher.from_config(om.create({"config": TINY, "dtype": "float32"}), seed=0, tokenizer=tokenizers["qwen2.5"],
                               **fields)


def test_a_named_teacher_takes_its_folders_tokenizer_and_a_module_none(tokenizers, metadata):
    named = Teacher("tiny-math-teacher")
    assert named.tokenizer_source == "tiny-math-teacher" and named.label == "tiny-math-teacher"
    assert named.reads(metadata)  # the shipped teacher has the mistral vocabulary
    module = Teacher(qwen(tokenizers).model)
    assert module.tokenizer_source is None and not module.reads(metadata)
    assert module.label.startswith("a random-init qwen2")
    with pytest.raises(ValueError, match="teacher_tokenizer: give its tokenizer"):
        module.side(tokenizers["llama2"])


def test_where_the_scoring_pass_puts_a_teachers_losses(tokenizers, metadata):
    """Alone and given no tokenizer, a teacher scores the shards' own teacher tokens; in a set, under its name; a
    teacher alone of another vocabulary, or a second teacher alone, is refused in one line."""
    assert Teacher(qwen(tokenizers).model).column(metadata, "S") is None
    assert qwen(tokenizers, name="qwen").column(metadata, "S") == "qwen"
    with pytest.raises(Refused, match="S holds 'mistral'.s teacher tokens, not this teacher's: .*--name NAME"):
        qwen(tokenizers).column(metadata, "S")
    scored = ShardMetadata(metadata.student, metadata.teacher, 64, scored_by={"name": "m"},
                           also_scored_by={"qwen": {"name": "q"}})
    with pytest.raises(Refused, match=r"S is already scored \(by m\)"):
        Teacher("tiny-math-teacher").column(scored, "S")
    with pytest.raises(Refused, match="already scored by a teacher named 'qwen' \\(q\\)"):
        qwen(tokenizers, name="qwen").column(scored, "S")


def test_what_shards_record_of_a_teacher_is_its_weights_dtype_and_label(tokenizers):
    teacher = qwen(tokenizers, label="tiny.yaml: teacher (config, seed 0)")
    assert teacher.dtype == "float32"
    recorded = teacher.scored_by()
    assert recorded["name"] == "tiny.yaml: teacher (config, seed 0)" and recorded["dtype"] == "float32"
    half = Teacher(qwen(tokenizers).model.to(torch.bfloat16))  # the dtype its weights have, whatever it was told
    assert half.dtype == "bfloat16" and half.scored_by()["dtype"] == "bfloat16"
    assert Teacher(qwen(tokenizers).model.half(), dtype="bfloat16").scored_by()["dtype"] == "float16"
    control = teacher.at_initialization(3)
    assert control.label.endswith("at initialization (seed 3)") and control.tokenizer is teacher.tokenizer
    assert control.scored_by()["fingerprint"] != recorded["fingerprint"]
    assert teacher.scored_by()["fingerprint"] == recorded["fingerprint"]  # the teacher itself is left as it was


def test_a_chunk_size_given_beside_liger_is_refused_even_the_default_one(tokenizers):
    """A chunk size given is a setting, whatever its value: Liger's kernels choose their own chunks."""
    model = qwen(tokenizers).model
    with pytest.raises(ValueError, match="chunk_size is PyTorch's kernels' own"):
        VocAgnoLM(teacher=Teacher(model, kernels="liger", chunk_size=CHUNK_SIZE))
    with pytest.raises(ValueError, match="chunk_size is PyTorch's kernels' own"):
        Teacher(model, kernels="liger", chunk_size=CHUNK_SIZE).check_options()
    assert Teacher(model).scorer().chunk_size == CHUNK_SIZE  # unset: the default of PyTorch's kernels


def test_the_algorithm_takes_a_teacher_and_refuses_options_beside_it(tokenizers):
    teacher = qwen(tokenizers)
    algorithm = VocAgnoLM(teacher=teacher)
    assert algorithm.teacher is teacher and algorithm.teachers.names == ["teacher"]
    with pytest.raises(TypeError, match="unexpected keyword argument 'teacher_dtype'"):  # the Teacher's dtype
        VocAgnoLM(teacher=teacher, teacher_dtype="float32")
    with pytest.raises(TypeError, match="unexpected keyword argument 'chunk_size'"):  # each teacher's own
        VocAgnoLM(teachers={"a": "tiny-math-teacher", "b": teacher}, chunk_size=512)
    assert KLD(teacher="tiny-math-teacher").teacher_tokenizer == "tiny-math-teacher"
    assert KLD(teacher={"name_or_path": "tiny-math-teacher", "tokenizer": "mistral"}).teacher_tokenizer == "mistral"


def test_a_set_names_its_teachers_and_reads_with_the_first_of_the_shards_vocabulary(tokenizers, metadata):
    made = teachers_from({"qwen": qwen(tokenizers), "math": {"name_or_path": "tiny-math-teacher", "chunk_size": 512}})
    assert [t.name for t in made] == ["qwen", "math"] and made[1].chunk_size == 512
    assert [t.name for t in reader_first(made, metadata)] == ["math", "qwen"]
    teachers = Teachers(made, cached=False)
    assert teachers.choose_reader(metadata) and teachers.names == ["math", "qwen"]
    assert not teachers.choose_reader(metadata) and teachers.other_names == ["qwen"]
    with pytest.raises(Refused, match=r"none of the teachers qwen, q2 reads the shards' teacher tokens"):
        reader_first([made[0], qwen(tokenizers, name="q2")], metadata)
    with pytest.raises(ValueError, match=r"unknown config key teachers.x.tokeniser \(did you mean teachers.x.tokenizer"
                                         r"\?\); allowed here: name_or_path, config, dtype, "):
        teachers_from({"x": {"name_or_path": "tiny-math-teacher", "tokeniser": "qwen2.5"}, "y": "tiny-math-teacher"})


def test_a_named_teacher_records_the_dtype_it_was_told_as_older_passes_did(tokenizers):
    """A resumed scoring pass compares what it records with what the interrupted one wrote: a teacher loaded by name
    records its dtype as given (``half`` stays ``half``); a module, the dtype its weights have."""
    assert Teacher("tiny-math-teacher", dtype="half").scored_by()["dtype"] == "half"
    assert Teacher(qwen(tokenizers).model.half(), dtype="bfloat16").scored_by()["dtype"] == "float16"


def test_a_control_keeps_its_fresh_weights_and_refuses_the_trained_teachers_losses(tokenizers):
    teacher = Teacher("tiny-math-teacher", dtype="float32")
    trained = teacher.scored_by()
    control = teacher.at_initialization(0)
    fresh = control.scored_by()
    assert fresh["fingerprint"] != trained["fingerprint"]
    [named, _] = teachers_from({"a": control, "b": "tiny-math-teacher"})  # renamed in a set: the same weights
    assert named.scored_by()["fingerprint"] == fresh["fingerprint"] and named.tokenizer_source == "tiny-math-teacher"
    control.check_scorer(fresh, "the shards were")
    with pytest.raises(ValueError, match="other weights"):
        control.check_scorer(trained, "the shards were")


def test_a_labelled_teacher_takes_the_losses_it_scored_itself():
    teacher = Teacher("tiny-math-teacher", dtype="float32", label="math-v1")
    teacher.check_scorer(teacher.scored_by(), "the shards were")
    with pytest.raises(ValueError, match="scored by 'tiny-math-teacher', but the teacher is 'math-v1'"):
        teacher.check_scorer({**teacher.scored_by(), "name": "tiny-math-teacher"}, "the shards were")


def test_a_fit_without_shards_keeps_the_reader_an_earlier_fit_chose(tokenizers, metadata):
    teachers = Teachers(teachers_from({"qwen": qwen(tokenizers), "math": "tiny-math-teacher"}), cached=False)
    assert teachers.choose_reader(metadata) and teachers.reader.name == "math"
    assert not teachers.choose_reader(None) and teachers.reader.name == "math"


def test_a_teacher_sharded_by_an_earlier_run_is_loaded_again_not_sharded_twice(tokenizers):
    """FSDP changes the module it shards in place: a second run (a second fit, or another trainer given the same
    Teacher) shards a fresh copy of a teacher given by name, and refuses, in one line, a module it can't reload."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel

    from vocagno.teacher.model import shard_teacher

    ours = not dist.is_initialized()  # an earlier Trainer of this process may have made one: kept as it is
    if ours:
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            port = free.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=1, rank=0)
    try:
        teacher = Teacher("tiny-math-teacher", dtype="float32")
        first = shard_teacher(teacher.scorer())
        second = shard_teacher(teacher.scorer())
        assert isinstance(first, FullyShardedDataParallel) and isinstance(second, FullyShardedDataParallel)
        assert second.module is not first.module
        module = Teacher(qwen(tokenizers).model)
        shard_teacher(module.scorer())
        with pytest.raises(ValueError, match="sharded by an earlier run: give it by name, or a new module"):
            module.scorer()
    finally:
        if ours:
            dist.destroy_process_group()


def test_a_section_an_entry_and_a_mapping_become_a_teacher_one_way(tokenizers):
    """``Teacher.from_config`` takes a yaml's section, a ``teachers:`` entry and llm-foundry's mapping alike: each key
    its ``TeacherConfig`` default where unset, an unknown key refused naming the closest one."""
    from vocagno.algorithms.baselines import ULD
    from vocagno.teacher.config import LOADED_DTYPE, TeacherConfig

    named = Teacher.from_config({"name_or_path": "tiny-math-teacher", "dtype": None})
    assert (named.model, named.dtype, named.placement, named.kernels) == (
        "tiny-math-teacher", LOADED_DTYPE, TeacherConfig.placement, TeacherConfig.kernels)
    algorithm = VocAgnoLM(teacher={"name_or_path": "tiny-math-teacher", "tokenizer": "mistral", "chunk_size": 512})
    assert algorithm.teacher.tokenizer_source == "mistral" and algorithm.teacher.chunk_size == 512
    with pytest.raises(ValueError, match=r"unknown config key teacher.chunksize \(did you mean teacher.chunk_size\?\)"):
        VocAgnoLM(teacher={"name_or_path": "tiny-math-teacher", "chunksize": 512})
    with pytest.raises(Refused, match="teacher is built from its config and needs its tokenizer"):
        Teacher.from_config(om.create({"config": TINY}))
    same = [Teacher.from_config({"config": TINY, "tokenizer": "qwen2.5"}, seed=3).fingerprint() for _ in range(2)]
    assert same[0] == same[1]  # a config-built teacher's weights: the section's and the seed's alone
    with pytest.raises(ValueError, match="teacher.placement: only algorithms.vocagno shards its teacher"):
        ULD(teacher={"name_or_path": "tiny-math-teacher", "placement": "replicate"})


def test_a_teacher_given_as_a_path_is_its_folder_as_a_name_would_give_it():
    """A ``pathlib.Path`` is a folder as a string is (as before the one way to build a teacher), not a mapping."""
    from pathlib import Path

    from vocagno.core.tokenization import shipped_model_dir

    folder = Path(shipped_model_dir("tiny-math-teacher"))
    pair = VocAgnoLM(teachers={"math": folder, "again": str(folder)}).teachers.all
    for teacher in (Teacher.of(folder), VocAgnoLM(teacher=folder).teacher, KLD(teacher=folder).teacher, pair[0]):
        assert teacher.model == str(folder) and teacher.label == str(folder), teacher


def test_ligers_chunk_budget_is_a_teacher_key_refused_without_its_kernels_and_resumed_only_with_the_same():
    """teacher.chunk_mem_const: Liger's fused cross-entropy's chunk budget, from a yaml section to the scorer; with
    PyTorch's kernels (which chunk by chunk_size) it is refused before anything loads, as is one that is no positive
    integer; a resumed scoring pass compares it (a key only where it is set, so older passes resume as before)."""
    from vocagno.errors import Refused
    from vocagno.teacher.config import TeacherConfig
    from vocagno.teacher.model import TeacherScorer

    with pytest.raises(Refused, match=r"^teacher\.chunk_mem_const is Liger's fused cross-entropy's; with kernels: "
                                      r"torch, chunk_size sets the chunks"):
        TeacherConfig.of({"chunk_mem_const": 8}).check_speed("teacher")
    with pytest.raises(Refused, match=r"teachers\.b\.chunk_mem_const must be a positive integer .* got 0"):
        TeacherConfig.of({"kernels": "liger", "chunk_mem_const": 0}).check_speed("teachers.b")
    teacher = Teacher.from_config({"name_or_path": "tiny-math-teacher", "dtype": "float32"})
    assert teacher.chunk_mem_const is None and "chunk_mem_const" not in teacher.scoring_settings()
    liger = Teacher.from_config({"name_or_path": "tiny-math-teacher", "kernels": "liger", "chunk_mem_const": 4})
    assert liger.chunk_mem_const == 4
    with pytest.raises(Refused, match="chunk_mem_const is Liger's"):
        TeacherScorer(teacher.load(), chunk_mem_const=4)


def test_the_scoring_pass_takes_ligers_chunk_budget_only_with_its_kernels(tmp_path, capsys):
    from vocagno import score

    with pytest.raises(SystemExit) as ended:
        score.main(["--shards", str(tmp_path), "--teacher", "tiny-math-teacher", "--chunk-mem-const", "8",
                    "--out", str(tmp_path / "out")])
    assert ended.value.code == 2
    assert "--chunk-mem-const is Liger's fused cross-entropy's; with kernels: torch" in capsys.readouterr().err

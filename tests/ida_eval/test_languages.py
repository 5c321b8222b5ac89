"""Every MBXP language through the real executor and sandbox with real toolchains.

Each language gets a small MBXP-shaped problem (prompt + completion + test, the test signalling a
wrong value the way that language's MBXP tests do) and completions that must pass, fail as a wrong
answer, exit 0 early (mxeval passes those; we must not), fail to compile, or break the assembly.
A language whose toolchain is not installed is skipped with the missing command named
(``python -m ida_eval.toolchains --install --yes`` installs them on Debian). Hostile programs in
JavaScript, Java and Go (write outside, network, fork bomb, daemon, output flood) must be contained
and leave no process behind. Scala and Kotlin compile for several seconds per task: marked slow.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from ida_eval import execute as ex
from ida_eval.languages import LANGUAGES, REACHED_END, LanguageError, assemble, language_of, missing_tools
from tests.conftest import mbxp_dir, processes_with
from tests.ida_eval.toys import TOYS, toy_problem

pytestmark = pytest.mark.slow  # real compilers and JVMs for every MBXP language

FAST = ex.ExecutionConfig(workers=2, timeout=10.0, run_timeouts=(("all", 15.0),), max_output_bytes=1 << 20)


def need(lang: str) -> None:
    missing = missing_tools(LANGUAGES[lang])
    if missing:
        pytest.skip(f"{lang} toolchain missing: {', '.join(missing)} (python -m ida_eval.toolchains --install)")


# Completions that try to pass without the test running to its end (issue 23, item 2): copy the
# nonce from stdin to stdout and exit 0, when the function is called ("call") or while the program
# loads, before main ("load": top-level code, static and package initialisers, global constructors);
# or end the file early without an error ("end": a top-level return, __END__, __halt_compiler).
FORGES: dict[str, dict[str, str]] = {
    "javascript": {
        "call": '    process.stdout.write(require("fs").readFileSync(0));\n    process.exit(0);\n}',
        "load": '    return a + b;\n}\nprocess.stdout.write(require("fs").readFileSync(0));\nprocess.exit(0);\n',
        "end": "    return a - b;\n}\nreturn;\n",
    },
    "typescript": {
        "call": '    process.stdout.write(require("fs").readFileSync(0));\n    process.exit(0);\n    return 0;\n}',
        "load": '    return a + b;\n}\nprocess.stdout.write(require("fs").readFileSync(0));\nprocess.exit(0);\n',
        "end": "    return a - b;\n}\nreturn;\n",
    },
    "java": {
        "call": "        try { System.out.write(System.in.readAllBytes()); } catch (Exception e) {}\n"
        "        System.out.flush();\n        System.exit(0);\n        return 0;\n    }\n}",
        "load": "        return a - b;\n    }\n    static {\n"
        "        try { System.out.write(System.in.readAllBytes()); } catch (Exception e) {}\n"
        "        System.out.flush();\n        System.exit(0);\n    }\n}",
    },
    "go": {
        "call": "\tbuf := make([]byte, 4096)\n\tn, _ := os.Stdin.Read(buf)\n\tos.Stdout.Write(buf[:n])\n\tos.Exit(0)\n\treturn 0\n}",
        "load": "\treturn a - b\n}\n\nvar forged = func() int {\n\tbuf := make([]byte, 4096)\n\tn, _ := os.Stdin.Read(buf)\n"
        "\tos.Stdout.Write(buf[:n])\n\tos.Exit(0)\n\treturn 0\n}()\n\nfunc init() {\n\tbuf := make([]byte, 4096)\n"
        "\tn, _ := os.Stdin.Read(buf)\n\tos.Stdout.Write(buf[:n])\n\tos.Exit(0)\n}\n",
    },
    "cpp": {
        "call": "    std::cout << std::cin.rdbuf() << std::flush;\n    exit(0);\n}",
        "load": "    return a - b;\n}\nstatic int forged = (std::cout << std::cin.rdbuf() << std::flush, exit(0), 0);\n"
        "__attribute__((constructor(101))) static void forge_early() {\n    char b[256];\n    size_t n = fread(b, 1, sizeof b, stdin);\n"
        "    fwrite(b, 1, n, stdout);\n    fflush(stdout);\n    _Exit(0);\n}\n",
    },
    "csharp": {
        "call": "            Console.OpenStandardInput().CopyTo(Console.OpenStandardOutput());\n            Environment.Exit(0);\n"
        "            return null;\n        }",
        "load": "            return new List<int> {a - b};\n        }\n        static int forged = Forge();\n"
        "        static int Forge() {\n            Console.OpenStandardInput().CopyTo(Console.OpenStandardOutput());\n"
        "            Environment.Exit(0);\n            return 0;\n        }",
    },
    "ruby": {
        "call": "  STDOUT.write(STDIN.read)\n  STDOUT.flush\n  exit!(0)\nend",
        "load": "  a - b\nend\nSTDOUT.write($stdin.read)\nSTDOUT.flush\nexit!(0)\n",
        "end": "  a - b\nend\n__END__\n",
        "return": "  a - b\nend\nreturn\n",
    },
    "php": {
        "call": "    fwrite(STDOUT, stream_get_contents(STDIN));\n    fwrite(STDOUT, file_get_contents('php://stdin'));\n"
        "    exit(0);\n}",
        "load": "    return $a - $b;\n}\nfwrite(STDOUT, stream_get_contents(STDIN));\nexit(0);\n",
        "end": "    return $a - $b;\n}\n__halt_compiler();\n",
        "return": "    return $a - $b;\n}\nreturn;\n",
    },
    "perl": {
        "call": "  local $/;\n  print STDOUT <STDIN>;\n  exit 0;\n}",
        "load": "  return $x - $y;\n}\nBEGIN { local $/; print STDOUT <STDIN>; exit 0; }\n",
        "end": "  return $x - $y;\n}\n__END__\n",
    },
    "scala": {
        "call": "        System.out.write(System.in.readAllBytes())\n        System.out.flush()\n        sys.exit(0)\n    }",
    },
    "kotlin": {
        "call": "    System.out.write(System.`in`.readAllBytes())\n    System.out.flush()\n    kotlin.system.exitProcess(0)\n}",
        "load": "    return a - b\n}\n\nval forged: Int = run {\n    System.out.write(System.`in`.readAllBytes())\n"
        "    System.out.flush()\n    kotlin.system.exitProcess(0)\n}\n",
    },
}

SLOW_LANGUAGES = ("scala", "kotlin")
PARAMS = [pytest.param(lang, marks=pytest.mark.slow) if lang in SLOW_LANGUAGES else lang for lang in TOYS]


def run_toy(lang: str, completions: dict[str, str], config: ex.ExecutionConfig = FAST) -> dict[str, dict[str, Any]]:
    problems = {}
    samples = []
    for i, (name, completion) in enumerate(completions.items()):
        p = toy_problem(lang, str(i))
        problems[p["task_id"]] = p
        samples.append({"task_id": p["task_id"], "completion": completion, "name": name})
    res = ex.execute_samples(problems, samples, config=config, progress=False)
    return {r["name"]: r for r in res}


@pytest.mark.parametrize("lang", PARAMS)
def test_right_wrong_and_early_exit(lang: str) -> None:
    need(lang)
    toy = TOYS[lang]
    cases = {k: toy[k] for k in ("right", "wrong", "early", "compile") if k in toy}
    res = run_toy(lang, cases)
    assert res["right"]["passed"], res["right"]["result"] + "\n" + res["right"]["stderr_tail"]
    assert res["right"]["result"] == "passed" and res["right"]["language"] == lang
    assert not res["wrong"]["passed"]
    assert ex.result_class(res["wrong"]) == "wrong_answer", res["wrong"]["result"]
    # mxeval scores this as passed (exit status 0): the test driver never reached its end
    assert not res["early"]["passed"]
    assert ex.result_class(res["early"]) == "early_exit", res["early"]["result"]
    if "compile" in res:
        assert ex.result_class(res["compile"]) == "compile_error", res["compile"]["result"]
        assert res["compile"]["compile_status"] not in (0, None)
        assert len(res["compile"]["result"]) > len("failed: compile error: ")  # the compiler's first lines
        assert "VM warning" not in res["compile"]["result"]  # a JVM's warnings are not the compiler's error


@pytest.mark.parametrize("lang", PARAMS)
def test_no_pass_forged_through_stdin_or_an_early_end(lang: str) -> None:
    """The nonce is read before any program code runs, so stdin is empty for the program; a file
    that ends early never arms the driver. Every forge must fail as an early exit (status 0 without
    the nonce: each one compiles and exits 0), the right answer still pass."""
    need(lang)
    res = run_toy(lang, {"right": TOYS[lang]["right"], **FORGES[lang]})
    assert res["right"]["passed"], res["right"]["result"] + "\n" + res["right"]["stderr_tail"]
    for name in FORGES[lang]:
        assert not res[name]["passed"], f"{lang} {name}: {res[name]['result']}"
        assert ex.result_class(res[name]) == "early_exit", f"{lang} {name}: {res[name]['result']}"


@pytest.mark.parametrize("lang", ["java", "csharp"])
def test_completion_that_closes_the_class_early_is_a_compile_error(lang: str) -> None:
    need(lang)
    res = run_toy(lang, {"closes": TOYS[lang]["closes_early"]})["closes"]
    assert not res["passed"] and ex.result_class(res) == "compile_error", res["result"]


def test_csharp_compare_net_objects_stand_in() -> None:
    """Our CompareLogic stand-in follows the library's default rules (resources/CompareNetObjects.cs)."""
    need("csharp")
    checks = [  # (expression pair, equal?)
        ("new List<int> {1, 2}", "new List<int> {1, 2}", True),
        ("new List<int> {1, 2}", "new List<int> {2, 1}", False),
        ("new List<int> {1, 2}", "new List<int> {1, 2, 3}", False),
        ("new List<long> {1}", "new List<int> {1}", False),  # different types
        ("3", "3L", False),
        ("new int[] {1, 2}", "new int[] {1, 2}", True),
        ('new Dictionary<string, int> {{"a", 1}, {"b", 2}}', 'new Dictionary<string, int> {{"a", 1}, {"b", 2}}', True),
        ('new Dictionary<string, int> {{"a", 1}, {"b", 2}}', 'new Dictionary<string, int> {{"a", 1}, {"b", 3}}', False),
        ('new Dictionary<string, int> {{"a", 1}, {"b", 2}}', 'new Dictionary<string, int> {{"b", 2}, {"a", 1}}', True),
        ('new Tuple<int, string>(1, "x")', 'new Tuple<int, string>(1, "x")', True),
        ('new Tuple<int, string>(1, "x")', 'new Tuple<int, string>(1, "y")', False),
        ("new List<List<int>> {new List<int> {1}}", "new List<List<int>> {new List<int> {1}}", True),
        ("0.1 + 0.2", "0.3", False),
        ("double.NaN", "double.NaN", True),
        ("(string)null", "(string)null", True),
        ('"abc"', '"abd"', False),
        ("new HashSet<int> {1, 2}", "new HashSet<int> {1, 2}", True),
    ]
    body = "".join(
        f"            if (compareLogic.Compare({a}, {b}).AreEqual != {str(eq).lower()}) "
        f'throw new Exception("Exception --- test case {i} failed to pass: {a.replace(chr(34), "")} vs {b.replace(chr(34), "")}");\n'
        for i, (a, b, eq) in enumerate(checks)
    )
    toy = dict(TOYS["csharp"])
    test = toy["test"].replace("            var actual1", body + "            var actual1")
    p = toy_problem("csharp") | {"test": test}
    res = ex.execute_samples(
        {p["task_id"]: p}, [{"task_id": p["task_id"], "completion": toy["right"]}], config=FAST, progress=False
    )
    assert res[0]["passed"], res[0]["result"] + "\n" + res[0]["stderr_tail"]


# ------------------------------------------------------------------ bad input: a record, never a crash


def test_bad_input_gives_records_not_crashes() -> None:
    need("java")
    need("go")
    java = toy_problem("java", "1")
    no_test = toy_problem("java", "2")
    del no_test["test"]
    cobol = toy_problem("java", "3") | {"language": "cobol"}
    go_no_main = toy_problem("go", "4") | {"test": "\n// no main here\n"}
    problems = {p["task_id"]: p for p in (java, no_test, cobol, go_no_main)}
    samples = [
        {"task_id": java["task_id"], "completion": TOYS["java"]["right"]},
        {"task_id": no_test["task_id"], "completion": TOYS["java"]["right"]},
        {"task_id": cobol["task_id"], "completion": "x"},
        {"task_id": go_no_main["task_id"], "completion": TOYS["go"]["right"]},
        {"task_id": java["task_id"], "completion": "}}}}", "language": "klingon"},
    ]
    res = ex.execute_samples(problems, samples, config=FAST, progress=False)
    assert res[0]["passed"]
    classes = [ex.result_class(r) for r in res[1:]]
    assert classes == ["bad_input"] * 4, [r["result"] for r in res]
    assert "has no test" in res[1]["result"]
    assert "unknown language 'cobol'" in res[2]["result"]
    assert "no 'func main() {' to wrap" in res[3]["result"]
    assert "unknown language 'klingon'" in res[4]["result"]


def test_toolchain_missing_is_reported_apart() -> None:
    if not missing_tools(LANGUAGES["swift"]):
        pytest.skip("swift is installed here: no language without a toolchain to test with")
    need("javascript")
    sw = {
        "task_id": "MBSWP/1",
        "language": "swift",
        "prompt": "func add(a: Int, b: Int) -> Int {\n",
        "test": "\nassert(add(a: 1, b: 2) == 3)\n",
        "entry_point": "add",
    }
    js = toy_problem("javascript")
    problems = {sw["task_id"]: sw, js["task_id"]: js}
    samples = [
        {"task_id": sw["task_id"], "completion": "    return a + b\n}"},
        {"task_id": js["task_id"], "completion": TOYS["javascript"]["right"]},
    ]
    res = ex.execute_samples(problems, samples, config=FAST, progress=False)
    assert res[0]["result"] == "toolchain missing: swift not found (swift)" and not res[0]["passed"]
    summary = ex.summarize(res, problems)
    assert summary["toolchain_missing"] == 1
    assert summary["pass@1"] == 0.5 and summary["pass@1_runnable"] == 1.0
    assert ex.summarize(res[:1], {sw["task_id"]: sw})["pass@1_runnable"] is None  # nothing ran: no score, not 0
    from ida_eval.sandbox import SAFE_PATH

    node_exe = shutil.which("node", path=SAFE_PATH)
    node = subprocess.run([node_exe, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    assert res[0]["toolchain"] is None and res[1]["toolchain"] == node  # what ran the verdict, as toolchains says
    assert summary["toolchains"] == [node]
    assert summary["languages"]["swift"]["toolchain_missing"] == 1
    assert summary["languages"]["javascript"]["pass@1"] == 1.0


def _not_reachable_by_others(*paths: Path) -> Path | None:
    """The first directory (or file) on the way to ``paths`` -- as written and resolved -- that a user
    other than the owner cannot traverse (or execute), else None."""
    import stat

    for path in paths:
        for p in {path, path.resolve()}:
            for d in [p, *p.parents]:
                mode = os.stat(d).st_mode
                if not mode & stat.S_IXOTH:
                    return d
    return None


def test_toolchains_cli_voice(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 23 item 9: tools are found on the sandbox's PATH whatever the caller's (no traceback
    when the caller's PATH lacks perl), ``--install --json`` is JSON, ``--install --yes`` without root
    is one line naming the need for root, exit 2."""
    import platform
    import subprocess
    import sys

    from ida_eval import toolchains

    need("perl")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert toolchains.main(["--language", "perl"]) == 0
    assert capsys.readouterr().out.split()[:3] == ["perl", "perl", "present"]
    assert toolchains.main(["--install", "--all", "--json", "--language", "perl", "--language", "swift"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "command": ["apt-get", "install", "-y", "--no-install-recommends", *LANGUAGES["perl"].packages],
        "no_debian_package": ["swift"],
    }
    assert toolchains.main(["--yes"]) == 2
    assert capsys.readouterr().err.startswith("ida_eval.toolchains: error: --all and --yes go with --install")
    # Python programs run under this interpreter (ida_eval.sandbox), whatever python3 PATH holds, or none
    (python,) = toolchains.toolchain_report(["python"])
    assert python["commands"] == [sys.executable] and python["present"]
    assert python["version"] == f"Python {platform.python_version()}"
    if os.geteuid() != 0:
        pytest.skip("the non-root case needs root to drop to another user")
    blocked = _not_reachable_by_others(Path(sys.executable), Path(__file__).resolve().parents[2])
    if blocked is not None:  # e.g. a checkout inside a mktemp -d directory (mode 0700)
        pytest.skip(f"another user cannot reach {blocked}: the non-root case cannot run this interpreter")
    res = subprocess.run(
        [sys.executable, "-m", "ida_eval.toolchains", "--install", "--all", "--yes", "--language", "perl"],
        capture_output=True,
        text=True,
        check=False,
        user=65534,
        group=65534,
        extra_groups=[],
        cwd="/",
        env={"PYTHONPATH": str(Path(__file__).resolve().parents[2]), "PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 2, res.stderr
    assert res.stderr.splitlines()[-1].startswith(
        "ida_eval.toolchains: error: --install --yes runs apt-get, which needs root"
    )
    assert "Traceback" not in res.stderr


def test_language_comes_from_the_record_else_the_task_prefix() -> None:
    assert language_of({"task_id": "MBJP/3"}) == "java"
    assert language_of({"task_id": "HumanEval_go/0"}) == "go"
    assert language_of({"task_id": "MBPP/1"}) == "python"
    assert language_of({"task_id": "MBJP/3", "language": "Kotlin"}) == "kotlin"
    assert language_of({"task_id": "X/1"}, {"language": "ruby"}) == "ruby"
    with pytest.raises(LanguageError, match="unknown task-id prefix 'X'"):
        language_of({"task_id": "X/1"})
    with pytest.raises(LanguageError, match="unknown language 'cobol'"):
        language_of({"task_id": "MBJP/3", "language": "cobol"})


def test_assembly_is_prompt_completion_test() -> None:
    for lang in TOYS:
        p = toy_problem(lang)
        files = assemble(LANGUAGES[lang], p, "<C>")
        name, text = files[0]
        assert name == LANGUAGES[lang].source
        if lang in ("go", "cpp"):  # the test's main is renamed (only there) and wrapped
            assert text.startswith(p["prompt"] + "<C>") and "ida_test_main(" in text
        elif lang == "csharp":  # net6's implicit usings first, for mcs
            assert text.endswith(p["prompt"] + "<C>" + p["test"]) and text.startswith("using System; ")
        else:  # a call that arms the driver where the file could end early without an error
            assert text == p["prompt"] + "<C>" + p["test"] + REACHED_END.get(lang, "")
    assert assemble(LANGUAGES["java"], toy_problem("java"), "")[0][0] == "main.java"  # mxeval's file name
    closed = toy_problem("php") | {"test": TOYS["php"]["test"] + "?>\n"}  # a test that leaves PHP mode
    assert assemble(LANGUAGES["php"], closed, "<C>")[0][1].endswith("?>\n\n<?php" + REACHED_END["php"])


def test_per_language_time_limits() -> None:
    cfg = ex.ExecutionConfig(run_timeouts=(("java", 7.0), ("all", 9.0)), compile_timeouts=(("kotlin", 300.0),))
    assert cfg.run_timeout(LANGUAGES["java"]) == 7.0 and cfg.run_timeout(LANGUAGES["go"]) == 9.0
    assert cfg.compile_timeout(LANGUAGES["kotlin"]) == 300.0
    assert cfg.compile_timeout(LANGUAGES["java"]) == LANGUAGES["java"].compile_timeout
    assert ex.ExecutionConfig().run_timeout(LANGUAGES["python"]) == ex.DEFAULT_TIMEOUT_S
    with pytest.raises(ValueError, match="unknown language 'cobol'"):
        ex.ExecutionConfig(run_timeouts=(("cobol", 1.0),))
    with pytest.raises(ValueError, match="compile_timeouts: java must be a number of seconds > 0"):
        ex.ExecutionConfig(compile_timeouts=(("java", 0.0),))


@pytest.mark.parametrize("lang", ["go", "java"])
def test_compile_and_run_timeouts_are_told_apart(lang: str) -> None:
    need(lang)
    loop = {"go": "\tfor {\n\t}\n}", "java": "        while (true) {}\n    }\n}"}[lang]
    cfg = ex.ExecutionConfig(workers=1, run_timeouts=((lang, 2.0),), compile_timeouts=((lang, 0.05),))
    res = run_toy(lang, {"right": TOYS[lang]["right"]}, cfg)["right"]
    assert res["result"] == "timed out (compile)" and ex.result_class(res) == "compile_timeout"
    cfg = ex.ExecutionConfig(workers=1, run_timeouts=((lang, 2.0),))
    res = run_toy(lang, {"loop": loop}, cfg)["loop"]
    assert res["result"] == "timed out" and res["compile_status"] == 0


def test_cli_runs_another_language(tmp_path: Path) -> None:
    need("ruby")
    import subprocess
    import sys

    p = toy_problem("ruby")
    (tmp_path / "p.jsonl").write_text(json.dumps(p) + "\n")
    (tmp_path / "s.jsonl").write_text(json.dumps({"task_id": p["task_id"], "completion": TOYS["ruby"]["right"]}) + "\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ida_eval.execute",
            "--problems",
            str(tmp_path / "p.jsonl"),
            "--samples",
            str(tmp_path / "s.jsonl"),
            "--out",
            str(tmp_path / "r.jsonl"),
            "--no-progress",
            "--run-timeout",
            "ruby=20",
            "--summary",
            str(tmp_path / "sum.json"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert proc.returncode == 0, proc.stderr
    assert "pass@1 = 1.0000" in proc.stdout
    assert json.loads((tmp_path / "sum.json").read_text())["languages"] == {
        "ruby": {"pass@1": 1.0, "samples": 1, "passed": 1, "toolchain_missing": 0}
    }
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "ida_eval.execute",
            "--problems",
            str(tmp_path / "p.jsonl"),
            "--canonical",
            "--out",
            str(tmp_path / "r2.jsonl"),
            "--run-timeout",
            "ruby",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and "--run-timeout wants LANG=SECONDS" in bad.stderr


# ------------------------------------------------------------------ hostile programs


def _marker() -> str:
    return f"0.{secrets.randbelow(10**12):012d}7"  # a valid extra `sleep` interval carrying a unique marker


HOSTILE: dict[str, dict[str, tuple[str, str]]] = {
    # case -> (prompt additions before the function, function body returning a + b only if the attack worked)
    "javascript": {
        "write": (
            "",
            '    try { require("fs").writeFileSync("{outside}", "x"); } catch (e) { return -1; }\n    return a + b;\n}',
        ),
        "network": (
            "",
            '    try { require("child_process").execFileSync("bash", ["-c", "exec 3<>/dev/tcp/127.0.0.1/{port}"]); }'
            " catch (e) { return -1; }\n    return a + b;\n}",
        ),
        "forkbomb": (
            "",
            '    for (;;) { try { require("child_process").spawn("sleep", ["300", "{marker}"]); } catch (e) {} }\n}',
        ),
        "daemon": (
            "",
            '    require("child_process").spawn("sleep", ["300", "{marker}"], {detached: true, stdio: "ignore"}).unref();\n'
            "    return a + b;\n}",
        ),
        "flood": ("", '    for (;;) { require("fs").writeSync(1, "x".repeat(65536)); }\n}'),
    },
    "java": {
        "write": (
            "",
            '        try { new java.io.FileWriter("{outside}").close(); } catch (Exception e) { return -1; }\n'
            "        return a + b;\n    }\n}",
        ),
        "network": (
            "",
            '        try { new java.net.Socket("127.0.0.1", {port}).close(); } catch (Exception e) { return -1; }\n'
            "        return a + b;\n    }\n}",
        ),
        "forkbomb": (
            "",
            '        for (;;) { try { new ProcessBuilder("sleep", "300", "{marker}").start(); } catch (Exception e) {} }\n    }\n}',
        ),
        "daemon": (
            "",
            '        try { new ProcessBuilder("setsid", "sleep", "300", "{marker}").start(); } catch (Exception e) { return -1; }\n'
            "        return a + b;\n    }\n}",
        ),
        "flood": (
            "",
            '        for (;;) { System.out.print("xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"); }\n    }\n}',
        ),
    },
    "go": {
        "write": (
            "",
            '\tif os.WriteFile("{outside}", []byte("x"), 0o644) != nil {\n\t\treturn -1\n\t}\n\treturn a + b\n}',
        ),
        "network": (
            'import "net"\n',
            '\tc, err := net.Dial("tcp", "127.0.0.1:{port}")\n\tif err != nil {\n\t\treturn -1\n\t}\n'
            "\tc.Close()\n\treturn a + b\n}",
        ),
        "forkbomb": ('import "os/exec"\n', '\tfor {\n\t\texec.Command("sleep", "300", "{marker}").Start()\n\t}\n}'),
        "daemon": (
            'import (\n\t"os/exec"\n\t"syscall"\n)\n',
            '\tc := exec.Command("sleep", "300", "{marker}")\n\tc.SysProcAttr = &syscall.SysProcAttr{Setsid: true}\n'
            "\tif c.Start() != nil {\n\t\treturn -1\n\t}\n\treturn a + b\n}",
        ),
        "flood": (
            'import "fmt"\n',
            '\tfor {\n\t\tfmt.Print("xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx")\n\t}\n}',
        ),
    },
}


@pytest.fixture
def listener():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    yield s.getsockname()[1]
    s.close()


@pytest.mark.parametrize("lang", list(HOSTILE))
def test_hostile_programs_are_contained(lang: str, tmp_path: Path, listener: int) -> None:
    need(lang)
    marker = _marker()
    outside = tmp_path / f"ida-hostile-{marker}"
    os.chmod(tmp_path, 0o777)  # world-writable: only the sandbox can stop a write here
    problems, samples = {}, []
    for i, (case, (extra, body)) in enumerate(HOSTILE[lang].items()):
        p = toy_problem(lang, str(i))
        if extra:  # Go: the package clause stays first, imports right after it
            head, _, rest = p["prompt"].partition("\n")
            p["prompt"] = head + "\n" + extra + rest
        problems[p["task_id"]] = p
        text = body.replace("{outside}", str(outside)).replace("{port}", str(listener)).replace("{marker}", marker)
        samples.append({"task_id": p["task_id"], "completion": text, "case": case})
    cfg = ex.ExecutionConfig(workers=2, run_timeouts=((lang, 8.0),), max_output_bytes=1 << 20, max_processes=64)
    t0 = time.monotonic()
    res = {r["case"]: r for r in ex.execute_samples(problems, samples, config=cfg, progress=False)}
    for case in ("write", "network"):
        assert not res[case]["passed"], (case, res[case]["result"], res[case]["stderr_tail"])
        assert ex.result_class(res[case]) == "wrong_answer", (case, res[case]["result"])
    assert not outside.exists()
    assert not res["forkbomb"]["passed"]
    assert res["flood"]["result"].startswith("failed: output limit exceeded"), res["flood"]["result"]
    assert res["daemon"]["passed"] or ex.result_class(res["daemon"]) == "wrong_answer", res["daemon"]["result"]
    deadline = time.monotonic() + 3.0
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(marker) == [], "a process of a sandboxed program survived its run"
    assert time.monotonic() - t0 < 120


# ------------------------------------------------------------------ MBXP data (skipped when absent)


def _mbxp_file(lang: str) -> Path:
    d = mbxp_dir()
    if d is None:
        pytest.skip("MBXP data not found (set IDA_MBXP_DIR or place it at ../shared/mbxp)")
    path = d / str(LANGUAGES[lang].mbxp_file)
    if not path.is_file():
        pytest.skip(f"{path} not found")
    return path


@pytest.mark.parametrize("lang", [lang for lang in LANGUAGES if lang != "python"])
def test_every_mbxp_file_loads_and_assembles(lang: str) -> None:
    """Every task of every language loads (null canonical_solution included) and assembles."""
    from ida_eval.problems import load_problems

    problems = load_problems(_mbxp_file(lang))
    for p in problems.values():
        assert language_of(p) == lang
        if lang != "swift":
            files = assemble(LANGUAGES[lang], p, "")
            assert files[0][0] == LANGUAGES[lang].source


def test_docs_language_table_matches_the_table_in_code() -> None:
    """docs/eval.md's language table: every language, its file and default limits, as in LANGUAGES."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "eval.md").read_text()
    block = text.split("<!-- check:language-table -->", 1)[1].strip().split("\n\n", 1)[0]
    rows = {}
    for line in block.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells
    assert set(rows) == set(LANGUAGES) - {"python"}
    for name, cells in rows.items():
        lang = LANGUAGES[name]
        assert cells[1] == f"`{lang.source}`", name
        assert (cells[2] == "none") == (lang.compile is None), name
        compile_s, run_s = (c.strip() for c in cells[4].split("/"))
        assert run_s == f"{lang.run_timeout:g}", name
        assert compile_s == ("none" if lang.compile is None else f"{lang.compile_timeout:g}"), name
        if lang.compile is not None and "..." not in cells[2]:
            shown = cells[2].strip("`").split()
            assert [w for w in lang.compile if not w.startswith("-J")] == shown, name


# ------------------------------------------------------------------ anchors (docs/eval.md "Anchors")

ANCHORS = json.loads((Path(__file__).with_name("mbxp_language_anchors.json")).read_text())
FULL = os.environ.get("IDA_MBXP_FULL") == "1"  # every recorded task, not the CI subset
SUBSET_PASSING, SUBSET_FAILING = 4, 3  # CI: the first passing and failing tasks of each anchor


def _anchor_params() -> list[Any]:
    params = []
    for lang, modes in ANCHORS.items():
        for mode in modes:
            marks = [pytest.mark.slow] if lang in SLOW_LANGUAGES or FULL else []
            params.append(pytest.param(lang, mode, marks=marks, id=f"{lang}-{mode}"))
    return params


def test_docs_anchor_table_matches_the_recorded_anchors() -> None:
    """docs/eval.md's anchors table quotes mbxp_language_anchors.json: tasks, our passes, mxeval's
    passes and how many verdicts differ, row for row, and nothing recorded is left out."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "eval.md").read_text()
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and cells[0] in ANCHORS and cells[1] in ("canonical", "samples"):
            rows[cells[0], cells[1]] = cells[2:6]
    want = {}
    for lang, modes in ANCHORS.items():
        for mode, a in modes.items():
            ref = a.get("reference")
            want[lang, mode] = [
                str(a["n"]),
                str(a["passed"]),
                str(ref["passed"]) if ref else "not run",
                str(len(ref["differ"])) if ref else "-",
            ]
    assert rows == want


@pytest.mark.parametrize("lang, mode", _anchor_params())
def test_anchor_verdicts(lang: str, mode: str) -> None:
    """Our verdicts on the canonical solutions / example samples, task for task, as recorded in
    mbxp_language_anchors.json (and summarised in docs/eval.md). CI runs a subset of each; set
    IDA_MBXP_FULL=1 for every recorded task (the command in docs/eval.md)."""
    need(lang)
    from ida_eval.problems import example_samples_file, load_problems

    path = _mbxp_file(lang)
    anchor = ANCHORS[lang][mode]
    problems = load_problems(path)
    if mode == "canonical":
        samples = ex.canonical_samples(problems)
    else:
        samples = ex.load_samples(example_samples_file(path), problems)
    samples = samples[: anchor["n"]]
    assert len(samples) == anchor["n"]
    if not FULL:
        passing = [s for s in samples if s["task_id"] not in anchor["failed"]][:SUBSET_PASSING]
        failing = [
            s
            for s in samples
            if s["task_id"] in anchor["failed"] and anchor["failed"][s["task_id"]] not in ("timeout", "compile_timeout")
        ][:SUBSET_FAILING]
        samples = passing + failing
    cfg = ex.ExecutionConfig(workers=2)
    res = ex.execute_samples(problems, samples, config=cfg, progress=False)
    got = {r["task_id"]: ex.result_class(r) for r in res if not r["passed"]}
    want = {s["task_id"]: anchor["failed"][s["task_id"]] for s in samples if s["task_id"] in anchor["failed"]}
    timing = ("timeout", "compile_timeout")  # load-dependent: only pass/fail is compared for those
    assert set(got) == set(want), (
        f"{lang} {mode}: failing tasks differ: now {sorted(set(got) - set(want))}, "
        f"no longer {sorted(set(want) - set(got))}"
    )
    assert {t: c for t, c in got.items() if c not in timing and want[t] not in timing} == {
        t: c for t, c in want.items() if c not in timing and got[t] not in timing
    }

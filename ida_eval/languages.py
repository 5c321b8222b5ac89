"""Per-language rules for executing MBXP / multilingual HumanEval programs: one table, one place.

Every language but Python is run as a :class:`~ida_eval.sandbox.ProgramJob` in the same sandbox as
Python (namespaces, read-only host, per-worker uid, rlimits, cgroups, process-tree kill). This
module says, per language, how the reference executor (mxeval, see
``shared/reference/mbxp_multilingual.md``) builds the program and which commands compile and run
it, and what we add so that a pass means the tests really ran:

* **Program text** = ``prompt + completion + test``, plain concatenation with no separator, exactly
  like mxeval, written to the file name mxeval uses where it matters (Java: ``main.java``).
* **End marker** (mxeval only looks at the exit status, so ``process.exit(0)``, ``System.exit(0)``,
  ``os.Exit(0)`` or ``exit`` in a completion pass without running a test): the run step's stdin holds
  a fresh nonce; a small *driver* reads it to the end of stdin before any program code runs and
  writes it to stdout after the last check; the sandbox passes a program only when the nonce arrived.
  The driver is a separate file where the language allows
  (JavaScript/TypeScript: read, ``require("./prog.js")``, write; Java/Scala/Kotlin/C#: an ``IdaMain``
  class calling the test's ``Main``; Ruby: ``-r ./ida_end.rb`` reads and registers an ``at_exit`` hook
  that only writes when no exception or ``exit`` is in flight; PHP: read, ``require "prog.php"``,
  write; Perl: read, ``do "./prog.pl"``, write). Go and C++ tests are a ``main`` function: the harness
  renames the test's ``main`` (in the test text only) to ``ida_test_main`` and adds a ``main`` that
  calls it and then writes (Go: ``ida_main.go``, compiled first, reads in a package-level variable;
  C++: ``ida_end.cpp``, linked first, reads from ``.preinit_array``). Where a file can end early
  without an error (a top-level ``return``, ``__END__``, ``__halt_compiler``), the program text ends
  with :data:`REACHED_END`, and the driver writes the nonce only when that line ran. Swift reads at the
  top of the program and writes at its end (no Swift toolchain in Debian: untested). docs/eval.md
  says what this stops and what it does not.
* **Compile and run** with the reference executor's compilers and flags (``javac``; ``g++`` with no
  ``-std``/``-O``; ``tsc --target es5 --lib es2016``; ``scalac``; ``kotlinc -include-runtime``), except:
  Go is built with ``go build`` before running (mxeval's ``go run`` compiles inside the run timeout);
  C# is compiled with Mono's ``mcs`` (no .NET SDK in Debian; see :data:`CSHARP_IMPLICIT_USINGS` and
  ``ida_eval/resources/CompareNetObjects.cs``); JVM tools get ``-XX:+UseSerialGC -XX:-UsePerfData``
  (fewer threads, no ``/tmp/hsperfdata``) and the compilers ``-XX:TieredStopAtLevel=1`` (no C2 JIT for a
  few seconds' work: about 40 % less CPU per ``kotlinc`` / ``scalac``): start-up only, verdicts unchanged.
* **TypeScript**: mxeval accepts only ``tsc`` exit status 2 ("errors, output emitted"), which every
  MBTSP program gets because ``import * as assert from 'assert'`` has no type declarations
  (TS2307); a program that type-checks cleanly (exit 0) would *fail* there. We accept 0 or 2 when
  the ``.js`` was emitted and call exit 1 (nothing emitted) a compile error. Without ``@types/node``
  (Debian has none) every program exits 0 or 2 exactly when mxeval's would exit 2, so verdicts stay
  comparable; with type declarations installed, ours stay right where mxeval's turn to failures.
* **Caches and daemons**: ``HOME`` and ``TMPDIR`` are the task's work directory; Go's build cache
  (``GOCACHE``) and ``GOPATH`` live there too, so nothing is written to the user's home or shared
  between tasks (C++ compiles read a precompiled ``bits/stdc++.h``, the JVM compilers a class-data archive, that
  no program can write: :mod:`ida_eval.precompiled` adds them to the commands below). No compile daemon is used
  (``kotlinc``/``scalac`` run in-process, Gradle/fsc never start), and anything a compiler leaves
  running is killed with its process group after the compile and with the PID namespace at the end.

Time limits: ``compile_timeout`` (default per language below; mxeval uses 100 s for every
compiler) and ``run_timeout`` are separate; a JVM start costs ~0.5 s, ``kotlinc`` and ``scalac``
several seconds per task on a busy machine.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "LANGUAGES",
    "Language",
    "LanguageError",
    "REACHED_END",
    "assemble",
    "language_of",
    "node_path",
]

GiB = 1 << 30
RESOURCES = Path(__file__).with_name("resources")
JVM_FLAGS = ("-XX:+UseSerialGC", "-XX:-UsePerfData")  # start-up only: fewer GC threads, no /tmp/hsperfdata
# javac, scalac and kotlinc run for seconds: the C2 JIT costs more CPU than it saves there
JVM_COMPILER_FLAGS = (*JVM_FLAGS, "-XX:TieredStopAtLevel=1")
_JVM_COMPILER_ARGS = tuple(f"-J{f}" for f in JVM_COMPILER_FLAGS)  # how javac / scalac / kotlinc pass them on
# .NET 6 implicit usings of mxeval's C# template project (ImplicitUsings=enable), prepended for mcs
CSHARP_IMPLICIT_USINGS = (
    "System",
    "System.Collections.Generic",
    "System.IO",
    "System.Linq",
    "System.Net.Http",
    "System.Threading",
    "System.Threading.Tasks",
)
NODE_MODULE_DIRS = ("/usr/share/nodejs", "/usr/lib/nodejs", "/usr/lib/node_modules", "/usr/local/lib/node_modules")
"""Where Debian (``node-lodash``) and npm put global modules; those present form ``NODE_PATH``."""


class LanguageError(ValueError):
    """A record's language is unknown, or its test cannot be wired to the end-marker driver."""


@dataclasses.dataclass(frozen=True)
class Language:
    """How one language's programs are built, compiled and run (see the module docstring).

    Attributes:
        name: the ``language`` field value (``"java"``).
        prefixes: task-id prefixes that mean this language when a record has no ``language``.
        source: the program's file name in the work directory.
        compile: compiler argv (``None``: interpreted), run in the work directory.
        run: run argv.
        tools: commands that must be on ``PATH`` (:mod:`ida_eval.toolchains` checks them).
        packages: Debian packages that provide the tools and libraries.
        version_cmd: argv printing the toolchain version.
        compile_timeout: default compile wall-clock limit, seconds.
        run_timeout: default run wall-clock limit, seconds.
        max_processes: processes + threads of the whole tree (a JVM or ``go build`` runs dozens).
        memory_bytes: address space per process and memory of the tree.
        compile_ok: compiler exit statuses that count as compiled.
        compile_output_file: a file the compiler must have produced (TypeScript's ``.js``).
        env: extra environment (``{work}`` = the work directory).
        stop_sequences: generation stop strings for this language (mxeval/bigcode-style: the next
            top-level declaration or the test block).
        mbxp_file / humaneval_file: the file names in the MBXP / multilingual HumanEval data dirs.
    """

    name: str
    prefixes: tuple[str, ...]
    source: str
    run: tuple[str, ...]
    tools: tuple[str, ...]
    packages: tuple[str, ...]
    version_cmd: tuple[str, ...]
    compile: tuple[str, ...] | None = None
    compile_timeout: float = 60.0
    run_timeout: float = 30.0
    max_processes: int = 256
    memory_bytes: int = 4 * GiB
    compile_ok: tuple[int, ...] = (0,)
    compile_output_file: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    stop_sequences: tuple[str, ...] = ()
    mbxp_file: str | None = None
    humaneval_file: str | None = None

    @property
    def compiled(self) -> bool:
        return self.compile is not None


def node_path() -> str:
    """``NODE_PATH`` for sandboxed Node: the global module dirs that exist (lodash lives in one)."""
    return ":".join(d for d in NODE_MODULE_DIRS if os.path.isdir(d))


_JVM_OPTS = " ".join(JVM_FLAGS)  # JAVA_OPTS: read by the scalac / scala / kotlinc launch scripts
_L = Language
LANGUAGES: dict[str, Language] = {
    lang.name: lang
    for lang in (
        _L(
            "python",
            ("MBPP", "HumanEval"),
            "prog.py",
            ("python3", "prog.py"),
            ("python3",),
            ("python3",),
            ("python3", "--version"),
            run_timeout=30.0,
            max_processes=64,
            # the bigcode MBPP set plus markdown fence and comment; deliberately no "\ndef" (generate.py)
            stop_sequences=("\nclass", "\nif", "\nprint", "\nassert", '\n"""', "\n```", "\n#"),
            mbxp_file="mbpp_release_v1.jsonl",
            humaneval_file="HumanEval.jsonl",
        ),
        _L(
            "javascript",
            ("MBJSP", "HumanEval_javascript"),
            "prog.js",
            ("node", "ida_main.js"),
            ("node",),
            ("nodejs", "node-lodash"),
            ("node", "--version"),
            env=(("NODE_PATH", "@node_path"),),
            stop_sequences=("\nconsole.log", "\nconst _ = require", "\nmodule.exports", "\n```", "\n/**"),
            mbxp_file="mbjsp_release_v1.2.jsonl",
            humaneval_file="HumanEval_javascript_v1.1.jsonl",
        ),
        _L(
            "typescript",
            ("MBTSP", "HumanEval_typescript"),
            "prog.ts",
            ("node", "ida_main.js"),
            ("tsc", "node"),
            ("nodejs", "node-typescript", "node-lodash"),
            ("tsc", "--version"),
            compile=("tsc", "--target", "es5", "--lib", "es2016", "prog.ts"),
            compile_ok=(0, 2),
            compile_output_file="prog.js",
            env=(("NODE_PATH", "@node_path"),),
            stop_sequences=("\nconsole.log", "\nimport ", "\nexport ", "\n```", "\nlet actual_"),
            mbxp_file="mbtsp_release_v1.2.jsonl",
            humaneval_file="HumanEval_typescript_v1.jsonl",
        ),
        _L(
            "java",
            ("MBJP", "HumanEval_java"),
            "main.java",
            ("java", *JVM_FLAGS, "-cp", ".", "IdaMain"),
            ("javac", "java"),
            ("default-jdk-headless",),
            ("javac", "-version"),
            compile=("javac", *_JVM_COMPILER_ARGS, "main.java", "IdaMain.java"),
            run_timeout=40.0,
            stop_sequences=("\nclass Main", "\npublic class Main", "\n```", "\n/**", "\n    public static void main"),
            mbxp_file="mbjp_release_v1.2.jsonl",
            humaneval_file="HumanEval_java_v1.1.jsonl",
        ),
        _L(
            "go",
            ("MBGP", "HumanEval_go"),
            "prog.go",
            ("./prog",),
            ("go",),
            ("golang-go",),
            ("go", "version"),
            compile=("go", "build", "-o", "prog", "ida_main.go", "prog.go"),
            env=(
                ("GOCACHE", "{work}/.gocache"),
                ("GOPATH", "{work}/.gopath"),
                ("GOPROXY", "off"),
                ("GOFLAGS", "-mod=mod"),
                ("GOTOOLCHAIN", "local"),
                ("GOTELEMETRY", "off"),
            ),
            stop_sequences=("\nfunc main(", "\n```", "\n// Example", "\n/*"),
            mbxp_file="mbgp_release_v1.1.jsonl",
            humaneval_file="HumanEval_go_v1.jsonl",
        ),
        _L(
            "cpp",
            ("MBCPP", "HumanEval_cpp"),
            "prog.cpp",
            ("./prog",),
            ("g++",),
            ("g++",),
            ("g++", "--version"),
            compile=("g++", "ida_end.cpp", "prog.cpp", "-o", "prog"),
            max_processes=64,
            stop_sequences=("\nint main(", "\n```", "\n/**"),
            mbxp_file="mbcpp_release_v1.2.jsonl",
        ),
        _L(
            "csharp",
            ("MBCSP", "HumanEval_csharp"),
            "Program.cs",
            ("mono", "prog.exe"),
            ("mcs", "mono"),
            ("mono-mcs", "mono-runtime", "libmono-system-net-http4.0-cil", "libmono-system-numerics4.0-cil"),
            ("mcs", "--version"),
            compile=(
                "mcs",
                "-nologo",
                "-nowarn:105",
                "-out:prog.exe",
                "-main:IdaMain",
                "-r:System.Numerics.dll",
                "-r:System.Net.Http.dll",
                "Program.cs",
                "IdaMain.cs",
                "CompareNetObjects.cs",
            ),
            stop_sequences=("\n        public static void Main", "\n    }\n}", "\n```", "\n        /// <summary>"),
            mbxp_file="mbcsp_release_v1.2.jsonl",
            humaneval_file="HumanEval_csharp_v1.jsonl",
        ),
        _L(
            "ruby",
            ("MBRBP", "HumanEval_ruby"),
            "prog.rb",
            ("ruby", "-r", "./ida_end.rb", "prog.rb"),
            ("ruby",),
            ("ruby",),
            ("ruby", "--version"),
            max_processes=64,
            stop_sequences=("\nputs", "\nprint", "\np(", "\n```", "\n##", "\nclass ", "\narg00"),
            mbxp_file="mbrbp_release_v1.2.jsonl",
            humaneval_file="HumanEval_ruby_v1.1.jsonl",
        ),
        _L(
            "php",
            ("MBPHP", "HumanEval_php"),
            "prog.php",
            ("php", "ida_main.php"),
            ("php",),
            ("php-cli",),
            ("php", "--version"),
            max_processes=64,
            stop_sequences=("\n```", "\n/**", "\necho", "\nprint", "\n$arg00", "\n$x0"),
            mbxp_file="mbphp_release_v1.2.jsonl",
            humaneval_file="HumanEval_php_v1.1.jsonl",
        ),
        _L(
            "perl",
            ("MBPLP", "HumanEval_perl"),
            "prog.pl",
            ("perl", "ida_main.pl"),
            ("perl",),
            ("perl", "libdata-compare-perl"),
            ("perl", "-e", "print $^V"),
            max_processes=64,
            stop_sequences=("\n```", "\nprint", "\nmy $arg00", "\n1;", "\n# Test"),
            mbxp_file="mbplp_release_v1.jsonl",
            humaneval_file="HumanEval_perl_v1.1.jsonl",
        ),
        _L(
            "scala",
            ("MBSCP", "HumanEval_scala"),
            "main.scala",
            ("scala", "-nc", "-cp", ".", "IdaMain"),
            ("scalac", "scala"),
            ("scala",),
            ("scalac", "-version"),
            compile=("scalac", *_JVM_COMPILER_ARGS, "-d", ".", "main.scala", "IdaMain.scala"),
            compile_timeout=120.0,
            run_timeout=40.0,
            env=(("JAVA_OPTS", _JVM_OPTS),),
            stop_sequences=("\n    println", "\n    var arg00", "\n}", "\n```"),
            mbxp_file="mbscp_release_v1.jsonl",
            humaneval_file="HumanEval_scala_v1.1.jsonl",
        ),
        _L(
            "kotlin",
            ("MBKP", "HumanEval_kotlin"),
            "prog.kt",
            ("java", *JVM_FLAGS, "-cp", "prog.jar", "IdaMain"),
            ("kotlinc", "java"),
            ("kotlin",),
            ("kotlinc", "-version"),
            compile=("kotlinc", *_JVM_COMPILER_ARGS, "prog.kt", "IdaMain.kt", "-include-runtime", "-d", "prog.jar"),
            compile_timeout=120.0,
            run_timeout=40.0,
            env=(("JAVA_OPTS", _JVM_OPTS),),
            stop_sequences=("\nfun main(", "\n```", "\n/**", "\nprintln"),
            mbxp_file="mbkp_release_v1.2.jsonl",
            humaneval_file="HumanEval_kotlin_v1.1.jsonl",
        ),
        _L(
            "swift",
            ("MBSWP", "HumanEval_swift"),
            "prog.swift",
            ("swift", "prog.swift"),
            ("swift",),
            (),
            ("swift", "--version"),
            stop_sequences=("\n```", "\nprint(", "\nvar arg00", "\n/**", "\nassert("),
            mbxp_file="mbswp_release_v1.jsonl",
            humaneval_file="HumanEval_swift_v1.1.jsonl",
        ),
    )
}
"""Every language, keyed by the ``language`` field value."""

_PREFIXES = sorted(((p, lang.name) for lang in LANGUAGES.values() for p in lang.prefixes), key=lambda x: -len(x[0]))


def language_of(record: Mapping[str, Any], problem: Mapping[str, Any] | None = None) -> str:
    """The language of a sample: its ``language`` field, else its problem's, else the task-id prefix
    (``MBJP/3`` -> java, ``HumanEval_go/0`` -> go, ``MBPP/1`` -> python).

    Raises:
        LanguageError: a ``language`` value that is not in :data:`LANGUAGES`, or no way to tell.
    """
    for source in (record, problem or {}):
        lang = source.get("language")
        if isinstance(lang, str) and lang:
            if lang.lower() not in LANGUAGES:
                raise LanguageError(f"unknown language {lang!r} (known: {', '.join(LANGUAGES)})")
            return lang.lower()
    tid = str(record.get("task_id", ""))
    head = tid.split("/", 1)[0]
    for prefix, name in _PREFIXES:
        if head == prefix:
            return name
    raise LanguageError(f"task {tid!r}: no 'language' field and an unknown task-id prefix {head!r}")


# ---------------------------------------------------------------------------------------------
# drivers: the end marker. Each reads the nonce from stdin to its end *before* any program code
# runs (the program then finds stdin at its end) and holds it where the program cannot name it;
# where a file can end early without an error (a top-level ``return``, ``__END__``,
# ``__halt_compiler``) the program text ends with :data:`REACHED_END`, which arms the driver.

_JS_DRIVER = """"use strict";
const end = require("fs").readFileSync(0);
let reached = false;
Object.defineProperty(globalThis, "__idaReachedEnd", { value: () => { reached = true; } });
require("./prog.js");
if (reached) process.stdout.write(end);
"""
_JAVA_DRIVER = """class IdaMain {
    public static void main(String[] args) throws Exception {
        byte[] end = System.in.readAllBytes();
        Main.main(args);
        System.out.flush();
        System.out.write(end);
        System.out.flush();
    }
}
"""
_SCALA_DRIVER = """object IdaMain {
  def main(args: Array[String]): Unit = {
    val end = System.in.readAllBytes()
    Main.main(args)
    Console.out.flush()
    System.out.flush()
    System.out.write(end)
    System.out.flush()
  }
}
"""
_KOTLIN_DRIVER = """private fun idaRunTests() { main() }

class IdaMain {
    companion object {
        @JvmStatic fun main(args: Array<String>) {
            val end = System.`in`.readAllBytes()
            idaRunTests()
            System.out.flush()
            System.out.write(end)
            System.out.flush()
        }
    }
}
"""
# a JVM initialises the test class when Main.main is called, after the read; the CLR may run its
# static field initialisers as soon as a method naming the class is compiled: the tests are called
# from a method of their own, compiled only after the read
_CSHARP_DRIVER = """public static class IdaMain
{
    public static void Main(string[] args)
    {
        var stdin = System.Console.OpenStandardInput();
        var end = new System.IO.MemoryStream();
        stdin.CopyTo(end);
        RunTests(args);
        System.Console.Out.Flush();
        var stdout = System.Console.OpenStandardOutput();
        end.WriteTo(stdout);
        stdout.Flush();
    }

    [System.Runtime.CompilerServices.MethodImpl(System.Runtime.CompilerServices.MethodImplOptions.NoInlining)]
    private static void RunTests(string[] args) { Solution.Program.Main(args); }
}
"""
# package-level variables are initialised before any init(), in declaration order, files in the order
# the compiler gets them: ida_main.go comes first (Language.compile), so idaEnd is read before
# anything of the program runs
_GO_DRIVER = """package main

import (
\t"io"
\t"os"
)

var idaEnd, _ = io.ReadAll(os.Stdin)

func main() {
\tida_test_main()
\tos.Stdout.Write(idaEnd)
}
"""
# ida_end.cpp is linked first: its .preinit_array entry runs before every constructor of the
# program (and before the libraries'); the nonce lives in this file's static storage
_CPP_DRIVER = """#include <stdio.h>
#include <unistd.h>

static char ida_end[256];
static ssize_t ida_end_len;

static void ida_read_end(int, char**, char**) {
    for (ssize_t n; ida_end_len < (ssize_t)sizeof ida_end
         && (n = read(0, ida_end + ida_end_len, sizeof ida_end - ida_end_len)) > 0;)
        ida_end_len += n;
}
__attribute__((section(".preinit_array"), used)) static void (*ida_read_end_entry)(int, char**, char**) = ida_read_end;

extern "C" int ida_test_main(%s);

int main(int argc, char* argv[]) {
    int status = ida_test_main(%s);
    if (status == 0) {
        fflush(stdout);
        if (write(1, ida_end, ida_end_len) != ida_end_len) return 1;
    }
    return status;
}
"""
_RUBY_DRIVER = """ida_end = STDIN.read
STDIN.reopen(File::NULL)
ida_reached = false
Object.send(:define_method, :__ida_reached_end) { ida_reached = true }
at_exit { if ida_reached && $!.nil? then STDOUT.write(ida_end); STDOUT.flush end }
"""
_PHP_DRIVER = """<?php
function ida_end_marker(int $step) {
    static $end = "", $reached = false;
    if ($step === 0) { $end = stream_get_contents(STDIN); }
    elseif ($step === 1) { $reached = true; }
    elseif ($reached) { fwrite(STDOUT, $end); }
}
function __ida_reached_end() { ida_end_marker(1); }
ida_end_marker(0);
require __DIR__ . "/prog.php";
ida_end_marker(2);
"""
_PERL_DRIVER = """my $ida_end = do { local $/; <STDIN> };
open(STDIN, "<", "/dev/null");
my $ida_reached = 0;
sub __ida_reached_end { $ida_reached = 1 }
do "./prog.pl";
if ($@) { print STDERR $@; exit 255; }
print STDOUT $ida_end if $ida_reached;
"""
REACHED_END = {
    "javascript": "\n;__idaReachedEnd();\n",
    "typescript": "\ndeclare const __idaReachedEnd: () => void;\n__idaReachedEnd();\n",
    "ruby": "\n__ida_reached_end\n",
    "php": "\n__ida_reached_end();\n",
    "perl": "\nmain::__ida_reached_end();\n",
}
"""Appended to the program text where the file can end early without an error: arms the driver."""
_SWIFT_HEAD = "import Foundation\nlet idaEnd = FileHandle.standardInput.readDataToEndOfFile()\n"
_SWIFT_DRIVER = "\nFileHandle.standardOutput.write(idaEnd)\n"

_GO_MAIN = re.compile(r"^func\s+main\s*\(\s*\)\s*\{", re.M)
_CPP_MAIN = re.compile(r"\bint\s+main\s*\(([^)]*)\)\s*\{")


def _compare_net_objects() -> str:
    return (RESOURCES / "CompareNetObjects.cs").read_text(encoding="utf-8")


def assemble(lang: Language, problem: Mapping[str, Any], completion: str) -> tuple[tuple[str, str], ...]:
    """The files of one program: ``(name, text)`` pairs, the program itself first.

    The program is mxeval's ``prompt + completion + test``; the driver files (or, for Go and C++,
    the renamed test ``main`` plus a new one) add the end marker (module docstring).

    Raises:
        LanguageError: Python (it has its own path), or a Go/C++ test without a ``main`` to wrap.
    """
    prompt, test = problem["prompt"], problem["test"]
    name = lang.name
    if name == "python":
        raise LanguageError("python programs are built by ida_eval.execute.build_program")
    if name == "go":
        test, n = _GO_MAIN.subn("func ida_test_main() {", test, count=1)
        if not n:
            raise LanguageError(f"task {problem.get('task_id')}: the go test has no 'func main() {{' to wrap")
        return ((lang.source, prompt + completion + test), ("ida_main.go", _GO_DRIVER))
    if name == "cpp":
        m = _CPP_MAIN.search(test)
        if m is None:
            raise LanguageError(f"task {problem.get('task_id')}: the C++ test has no 'int main(...) {{' to wrap")
        params, args = ("", "") if m.group(1).strip() in ("", "void") else ("int, char**", "argc, argv")
        test = test[: m.start()] + f'extern "C" int ida_test_main({m.group(1)}) {{' + test[m.end() :]
        return ((lang.source, prompt + completion + test), ("ida_end.cpp", _CPP_DRIVER % (params, args)))
    program = prompt + completion + test
    if name == "csharp":
        usings = "".join(f"using {u}; " for u in CSHARP_IMPLICIT_USINGS)
        return (
            (lang.source, usings + program),
            ("IdaMain.cs", _CSHARP_DRIVER),
            ("CompareNetObjects.cs", _compare_net_objects()),
        )
    if name == "swift":
        return ((lang.source, _SWIFT_HEAD + program + _SWIFT_DRIVER),)
    if name in REACHED_END:
        reopen = "\n<?php" if name == "php" and program.rfind("?>") > program.rfind("<?php") else ""
        program += reopen + REACHED_END[name]
    drivers = {
        "javascript": (("ida_main.js", _JS_DRIVER),),
        "typescript": (("ida_main.js", _JS_DRIVER),),
        "java": (("IdaMain.java", _JAVA_DRIVER),),
        "scala": (("IdaMain.scala", _SCALA_DRIVER),),
        "kotlin": (("IdaMain.kt", _KOTLIN_DRIVER),),
        "ruby": (("ida_end.rb", _RUBY_DRIVER),),
        "php": (("ida_main.php", _PHP_DRIVER),),
        "perl": (("ida_main.pl", _PERL_DRIVER),),
    }
    return ((lang.source, program), *drivers[name])


def environment(lang: Language) -> tuple[tuple[str, str], ...]:
    """The language's extra environment with host-dependent values filled in (``@node_path``)."""
    return tuple((k, node_path() if v == "@node_path" else v) for k, v in lang.env)


def tool_env(lang: Language | None = None) -> dict[str, str]:
    """The environment a tool is run with outside the sandbox (version checks, installs, the precompiled C++
    header): the sandbox's ``PATH``, ``LANG=C.UTF-8``, plus ``lang``'s own variables that name no work directory."""
    from ida_eval.sandbox import SAFE_PATH

    env = {"PATH": SAFE_PATH, "LANG": "C.UTF-8"}
    if lang is not None:
        env.update((k, v) for k, v in environment(lang) if "{work}" not in v)
    return env


def missing_tools(lang: Language) -> list[str]:
    """The language's tools not found on the sandbox's ``PATH`` (empty: it can run here)."""
    from ida_eval.sandbox import SAFE_PATH

    return [t for t in lang.tools if shutil.which(t, path=SAFE_PATH) is None]

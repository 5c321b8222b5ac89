"""One toy MBXP-shaped problem per language (prompt + test signalling a wrong value the way that
language's MBXP tests do), with right / wrong / early-exit completions and one that must not compile:
the shared input of tests/ida_eval/test_languages.py and test_mbxp.py."""

from __future__ import annotations

from typing import Any

from ida_eval.languages import LANGUAGES

# ------------------------------------------------------------------ one toy problem per language
# right / wrong / early-exit completions; "compile" = a completion that must not compile

TOYS: dict[str, dict[str, Any]] = {
    "javascript": {
        "prompt": "/**\n * Add two numbers.\n */\nfunction add(a, b) {\n",
        "test": '\nconst _ = require("lodash")\n\nfunction compare(object1, object2){\n    return _.isEqual(object1, object2)\n}\n\n'
        "var x0 = add(1, 2);\nif(!compare(x0, 3)){\n    throw 'Error at 1th assert statement. Value = ' + JSON.stringify(x)\n}\n",
        "right": "    return a + b;\n}",
        "wrong": "    return a - b;\n}",
        "early": "    process.exit(0);\n}",
    },
    "typescript": {
        "prompt": "const add = function (a: number, b: number) : number  {\n",
        "test": "\nimport * as assert from 'assert'\n\nlet actual_1 = add(1, 2);\nlet expected_1 = 3;\n"
        'assert.deepEqual(actual_1, expected_1, "Exception --- test case 0 failed to pass");\n',
        "right": "    return a + b;\n}",
        "wrong": "    return a - b;\n}",
        "early": "    process.exit(0);\n    return 0;\n}",
    },
    "java": {
        "prompt": "import java.io.*;\nimport java.lang.*;\nimport java.util.*;\nimport java.math.*;\n\n\nclass Add {\n"
        "    public static int add(int a, int b) {\n",
        "test": "\n\nclass Main {\n    public static void main(String[] args) throws Exception {\n        int x0 = Add.add(1, 2);\n"
        '        if (x0 != 3) {\n            throw new java.lang.Exception("Exception -- test case 0 did not pass. x0 = " + x0);\n'
        "        }\n\n\n}\n}\n",
        "right": "        return a + b;\n    }\n}",
        "wrong": "        return a - b;\n    }\n}",
        "early": "        System.exit(0);\n        return 0;\n    }\n}",
        "compile": '        return "three";\n    }\n}',
        "closes_early": "        return a + b;\n    }\n}\n}\n}",
    },
    "go": {
        "prompt": 'package main\n\nimport (\n\t"encoding/json"\n\t"os"\n\t"reflect"\n)\n\n'
        "var _ = os.Args\n\nfunc add(a int, b int) int {\n",
        "test": "\n\nfunc deepCompare(a interface{}, b interface{}, msg string) bool {\n\taJSON, _ := json.Marshal(a)\n"
        "\tbJSON, _ := json.Marshal(b)\n\tvar aVal, bVal interface{}\n\tjson.Unmarshal(aJSON, &aVal)\n\tjson.Unmarshal(bJSON, &bVal)\n"
        "\tif !reflect.DeepEqual(aVal, bVal) {\n\t\tpanic(msg)\n\t}\n\treturn true\n}\n\nfunc main() {\n"
        '\tdeepCompare(add(1, 2), 3, "Exception --- test case 0 failed to pass")\n\n}',
        "right": "\treturn a + b\n}",
        "wrong": "\treturn a - b\n}",
        "early": "\tos.Exit(0)\n\treturn 0\n}",
        "compile": '\treturn "three"\n}',
    },
    "cpp": {
        "prompt": "#include <bits/stdc++.h>\nusing namespace std;\n\n\nint add(int a, int b) {\n",
        "test": "\n\ntemplate <typename T> bool compare(T a, T b){ \n    return a == b; \n}\n\nint main(int argc, char* argv[]) {\n"
        "    int x0 = add(1, 2);\n    if (!(compare(x0, 3))) {\n"
        '        throw runtime_error("Exception -- test case 0 did not pass.");\n    }\n\n    return 0;\n}',
        "right": "    return a + b;\n}",
        "wrong": "    return a - b;\n}",
        "early": "    exit(0);\n}",
        "compile": '    return string("three");\n}',
    },
    "csharp": {
        "prompt": "using System;\nusing System.Collections.Generic;\nusing System.Linq;\nusing System.Text.RegularExpressions;\n"
        "using KellermanSoftware.CompareNetObjects;\n\nnamespace Solution\n{\n    public class Program\n    {\n"
        "        public static List<int> Add (int a, int b) \n        {\n",
        "test": "\n\n        public static void Main(string[] args)\n        {\n"
        "            CompareLogic compareLogic = new CompareLogic();\n"
        "            var actual1 = Add(1, 2);\n            var expected1 = new List<int> {3};\n"
        "            var result1 = compareLogic.Compare(actual1, expected1);\n"
        '            if (!result1.AreEqual) {throw new Exception("Exception --- test case 0 failed to pass");}\n\n'
        "        }\n    }\n}\n",
        "right": "            return new List<int> {a + b};\n        }",
        "wrong": "            return new List<int> {a - b};\n        }",
        "early": "            Environment.Exit(0);\n            return null;\n        }",
        "compile": "            return 3;\n        }",
        "closes_early": "            return new List<int> {a + b};\n        }\n    }\n}",
    },
    "ruby": {
        "prompt": "##\n# Add two numbers.\ndef add(a, b)\n",
        "test": '\n\nx0 = add(1, 2)\nif x0 != 3\n    raise StandardError, "Error at test case 1"\nend\n\n',
        "right": "  a + b\nend",
        "wrong": "  a - b\nend",
        "early": "  exit 0\nend",
    },
    "php": {
        "prompt": "<?php\n/**\n * Add two numbers.\n */\nfunction add($a, $b){\n",
        "test": "\n\nfunction compare($x, $y) {\n    return $x == $y;\n}\n\n$x0 = add(1, 2);\nif (!compare($x0, 3)) {\n"
        '    throw new Exception("Error at 1th assert statement.");\n}\n',
        "right": "    return $a + $b;\n}",
        "wrong": "    return $a - $b;\n}",
        "early": "    exit(0);\n}",
    },
    "perl": {
        "prompt": "# Add two numbers.\nsub add\n{\n  my ($x, $y) = @_;\n",
        "test": "\n\nuse Data::Compare;\n\nmy $x0 = add(1, 2);\nunless(Compare($x0, 3)) {\n"
        '    die "Exception -- test case 0 did not pass.";\n}\n',
        "right": "  return $x + $y;\n}",
        "wrong": "  return $x - $y;\n}",
        "early": "  exit 0;\n}",
    },
    "scala": {
        "prompt": "import scala.math._\nimport scala.collection.mutable._\nobject Main extends App {\n"
        "    def add(a : Int, b : Int) : Int = {\n",
        "test": '\n\n    var x0 : Int = add(1, 2)\n    assert(x0 == 3, "Exception -- test case 0 did not pass. x0 = " + x0)\n\n\n}\n',
        "right": "        a + b\n    }",
        "wrong": "        a - b\n    }",
        "early": "        sys.exit(0)\n    }",
        "compile": '        "three"\n    }',
    },
    "kotlin": {
        "prompt": "/**\n * Add two numbers.\n */\nfun add(a : Int, b : Int) : Int {\n",
        "test": "\nfun main() {\n    var x0 : Int = add(1, 2);\n    if (x0 != 3) {\n"
        '        throw Exception("Exception -- test case 0 did not pass. x0 = " + x0)\n    }\n\n\n}\n',
        "right": "    return a + b\n}",
        "wrong": "    return a - b\n}",
        "early": "    kotlin.system.exitProcess(0)\n}",
        "compile": '    return "three"\n}',
    },
}


def toy_problem(lang: str, tid: str = "0") -> dict[str, Any]:
    toy = TOYS[lang]
    prefix = LANGUAGES[lang].prefixes[0]
    return {
        "task_id": f"{prefix}/{tid}",
        "language": lang,
        "prompt": toy["prompt"],
        "test": toy["test"],
        "entry_point": "add",
    }

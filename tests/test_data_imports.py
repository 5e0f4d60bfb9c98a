"""The data floor loads only what a run uses (issue 55 item 1), measured with ``python -X importtime``.

- ``ecomkit.data`` loads a name's module when the name is first asked for, and every name it lists resolves.
- What a catalog run reads (``data.build``, ``data.packing``) loads no user file's row checks or span readers, no
  bucketed sampler and no task nlu targets.
- ``data.targets`` loads when task nlu asks for an example, and only then.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
from import_cost import REPO, python_import

import ecomkit.data

USER_FILE = ("ecomkit.data.loaders", "ecomkit.data.validate", "ecomkit.data.spans", "ecomkit.data.columns",
             "ecomkit.data.file_rows", "ecomkit.data.rows", "ecomkit.data.questions", "ecomkit.data.writers")
OTHER_PATHS = ("ecomkit.data.sampler", "ecomkit.data.targets", "ecomkit.data.padding", "ecomkit.data.toy_tasks")


def test_the_data_package_loads_a_name_s_module_when_the_name_is_asked_for():
    assert python_import("ecomkit.data").loaded("ecomkit.data") == ["ecomkit.data"]
    for name, module in ecomkit.data.HOME_OF.items():
        assert getattr(ecomkit.data, name) is getattr(importlib.import_module(module), name), name
    assert sorted(ecomkit.data.__all__) == sorted(ecomkit.data.HOME_OF)


@pytest.mark.parametrize("module", ["ecomkit.data.build", "ecomkit.data.packing"])
def test_what_a_catalog_run_reads_loads_no_user_file_code_and_no_other_path(module):
    cost = python_import(module)
    assert module in cost.modules
    assert not [m for m in cost.modules if m in USER_FILE + OTHER_PATHS]


def test_task_nlu_loads_its_targets_by_name_and_task_lm_does_not():
    """An lm example never loads ``data.targets``; the first nlu example does, and is the category question."""
    code = ("import sys\n"
            "from ecomkit.data.tasks import task_examples\n"
            "record = {'title': '星驰 智能手机', 'category': '手机'}\n"
            "(lm,) = task_examples(record, 'lm', {})\n"
            "assert lm.task == 'lm' and 'ecomkit.data.targets' not in sys.modules\n"
            "kinds = [ex.task for ex in task_examples(record, 'nlu', {}, 'seqgpt')]\n"
            "assert 'ecomkit.data.targets' in sys.modules, 'not loaded'\n"
            "print(kinds)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["['category']"]

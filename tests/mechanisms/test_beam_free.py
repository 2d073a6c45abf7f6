"""The numpy core must import and run without Apache Beam."""
from tests.support.beam_free import assert_runs_without_beam


def test_mechanisms_import_no_apache_beam():
    assert_runs_without_beam("import transforms.mechanisms as m; "
                             "m.make('binary_tree', 8, epsilon=1.0, seed=1).release([1] * 8)")

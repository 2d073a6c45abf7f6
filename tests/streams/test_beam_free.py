"""The stream core must import and run without Apache Beam."""
from tests.support.beam_free import assert_runs_without_beam


def test_streams_import_no_apache_beam():
    assert_runs_without_beam("import transforms.streams as s; "
                             "s.count_distinct_streams([(0, '+', 'a')], 2, 1)")

//! Reference-model property test: random grids and batches, CPU compactor against the
//! naive sort-and-concatenate reference in `testkit`.

use proptest::prelude::*;

use super::testkit::{Rng, Scenario, assert_same, random_batch, reference};
use super::{Compactor, CpuCompactor, Packed};

proptest! {
    // No failure file: a test binary copied to another machine (the GPU device) has no
    // source tree to keep one in; a failure prints its seed and minimal case instead.
    #![proptest_config(ProptestConfig {
        cases: 96,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn cpu_matches_reference_model(
        seed in any::<u64>(),
        rank in 0usize..=4,
        scenario in prop::sample::select(Scenario::ALL.to_vec()),
        threads in 1usize..=3,
        streaming in any::<bool>(),
    ) {
        let b = random_batch(&mut Rng::new(seed), rank, scenario);
        let cpu = CpuCompactor::with_threads(threads)
            .streaming_from(if streaming { 0 } else { u64::MAX });
        let mut out = Packed::default();
        cpu.compact(&b.view(), &mut out).unwrap();
        assert_same(&out, &reference(&b.view()), "cpu vs reference");
    }
}

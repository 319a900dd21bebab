//! How a parse's cost grows, measured without a clock bound: a machine's
//! speed divides out of the ratio of two inputs' times in one run. For
//! tests that hold a parser linear on hostile input.

use std::time::{Duration, Instant};

/// The least of five timings of `f`: one descheduling on a loaded
/// machine raises a single timing, not all five.
fn least(mut f: impl FnMut()) -> Duration {
    (0..5)
        .map(|_| {
            let started = Instant::now();
            f();
            started.elapsed()
        })
        .min()
        .expect("five timings")
}

/// The cost of `big` over that of `small`.
pub(crate) fn ratio(small: impl FnMut(), big: impl FnMut()) -> f64 {
    let (s, b) = (least(small), least(big));
    b.as_secs_f64() / s.as_secs_f64().max(1e-9)
}

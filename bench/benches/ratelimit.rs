//! Our token bucket (`controller/src/ratelimit.rs`) against `governor`'s direct limiter
//! (`until_ready`), as the controller uses one: one limiter shared by 16 node writers that
//! always have work (`--write-concurrency` 16) and a sporadic caller (the publisher or the
//! config writer: one request every 100 ms), each request taking 2 ms once let go. Reported per
//! limiter, rounds interleaved: the wait of each acquire (median, p99, max), the sporadic
//! caller's longest wait (a publication gates the allocations behind it), the rate achieved
//! against the configured one, and the process's CPU time per 1,000 acquires.
//!
//! `cargo bench -p nodeipam-bench --bench ratelimit [-- ROUNDS]`, or `hack/bench/ratelimit.sh`.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nodeipam_controller::process_metrics::Stat;
use nodeipam_controller::ratelimit::RateLimiter;

const QPS: f64 = 100.0;
const BURST: u32 = 10;
const WRITERS: usize = 16;
/// Requests per round, the writers' and the sporadic caller's together: about 3 s at `QPS`.
const REQUESTS: usize = 300;
const REQUEST_TIME: Duration = Duration::from_millis(2);
const SPORADIC_EVERY: Duration = Duration::from_millis(100);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Ours,
    Governor,
}

/// One of the two limiters behind one `acquire`.
enum Limiter {
    Ours(RateLimiter),
    Governor(governor::DefaultDirectRateLimiter),
}

impl Limiter {
    fn new(kind: Kind) -> Limiter {
        match kind {
            Kind::Ours => Limiter::Ours(RateLimiter::new(QPS, BURST)),
            Kind::Governor => {
                let period = Duration::from_secs_f64(1.0 / QPS);
                #[allow(clippy::expect_used)]
                let quota = governor::Quota::with_period(period)
                    .expect("a non-zero period")
                    .allow_burst(NonZeroU32::new(BURST).expect("a non-zero burst"));
                Limiter::Governor(governor::RateLimiter::direct(quota))
            }
        }
    }

    async fn acquire(&self) {
        match self {
            Limiter::Ours(l) => l.acquire().await,
            Limiter::Governor(l) => l.until_ready().await,
        }
    }
}

struct Round {
    waits: Vec<Duration>,
    sporadic_max: Duration,
    rate: f64,
    cpu_per_1000: f64,
}

fn cpu_seconds() -> f64 {
    let hz = rustix::param::clock_ticks_per_second();
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| Stat::parse(&s).ok())
        .map_or(f64::NAN, |s| s.cpu_seconds(hz))
}

async fn round(kind: Kind) -> Round {
    let limiter = Arc::new(Limiter::new(kind));
    let left = Arc::new(AtomicUsize::new(REQUESTS));
    let cpu = cpu_seconds();
    let start = Instant::now();
    let mut writers = tokio::task::JoinSet::new();
    for _ in 0..WRITERS {
        let (limiter, left) = (limiter.clone(), left.clone());
        writers.spawn(async move {
            let mut waits = Vec::new();
            while left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                let asked = Instant::now();
                limiter.acquire().await;
                waits.push(asked.elapsed());
                tokio::time::sleep(REQUEST_TIME).await;
            }
            waits
        });
    }
    let sporadic = {
        let (limiter, left) = (limiter.clone(), left.clone());
        tokio::spawn(async move {
            let mut longest = Duration::ZERO;
            while left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                let asked = Instant::now();
                limiter.acquire().await;
                longest = longest.max(asked.elapsed());
                tokio::time::sleep(SPORADIC_EVERY).await;
            }
            longest
        })
    };
    let mut waits = Vec::new();
    while let Some(w) = writers.join_next().await {
        #[allow(clippy::expect_used)]
        waits.extend(w.expect("a writer task"));
    }
    let elapsed = start.elapsed();
    #[allow(clippy::expect_used)]
    let sporadic_max = sporadic.await.expect("the sporadic task");
    let granted = waits.len() + 1;
    Round {
        waits,
        sporadic_max,
        // The burst goes at once; the rest at the rate.
        rate: (granted as f64 - f64::from(BURST)) / elapsed.as_secs_f64(),
        cpu_per_1000: (cpu_seconds() - cpu) * 1000.0 / granted as f64,
    }
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Median of the rounds' values, and their spread (min..max).
fn summary(values: &mut [f64]) -> String {
    values.sort_by(f64::total_cmp);
    let (lo, hi) = (values[0], values[values.len() - 1]);
    format!("{:>8.2} ({lo:.2}..{hi:.2})", quantile(values, 0.5))
}

fn main() {
    // `cargo bench` passes `--bench`; a number is the rounds.
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(10);
    #[allow(clippy::expect_used)]
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let kinds = [Kind::Ours, Kind::Governor];
    let mut results: Vec<Vec<Round>> = vec![Vec::new(), Vec::new()];
    for r in 0..rounds {
        // Interleaved, the order swapped every round, so drift in the machine hits both.
        let order = if r % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            results[i].push(rt.block_on(round(kinds[i])));
        }
    }
    println!(
        "{rounds} rounds, {WRITERS} writers + 1 sporadic caller, {QPS} qps, burst {BURST}, {REQUESTS} requests a round; median of rounds (min..max)"
    );
    println!(
        "{:<9} {:>24} {:>24} {:>24} {:>24} {:>24} {:>24}",
        "limiter",
        "wait p50 ms",
        "wait p99 ms",
        "wait max ms",
        "sporadic max ms",
        "rate /s",
        "cpu ms/1000"
    );
    for (kind, rounds) in kinds.iter().zip(&results) {
        let mut cols: [Vec<f64>; 6] = Default::default();
        for round in rounds {
            let mut w: Vec<f64> = round.waits.iter().copied().map(ms).collect();
            w.sort_by(f64::total_cmp);
            cols[0].push(quantile(&w, 0.5));
            cols[1].push(quantile(&w, 0.99));
            cols[2].push(w[w.len() - 1]);
            cols[3].push(ms(round.sporadic_max));
            cols[4].push(round.rate);
            cols[5].push(round.cpu_per_1000 * 1000.0);
        }
        let cells: Vec<String> = cols.iter_mut().map(|c| summary(c)).collect();
        println!(
            "{:<9} {:>24} {:>24} {:>24} {:>24} {:>24} {:>24}",
            format!("{kind:?}").to_lowercase(),
            cells[0],
            cells[1],
            cells[2],
            cells[3],
            cells[4],
            cells[5]
        );
    }
}

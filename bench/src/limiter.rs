//! A token bucket with client-go's `--kube-api-qps`/`--kube-api-burst` meaning, for the loader
//! and the floor patcher: `burst` requests at once, then `qps` per second.

use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

pub struct Limiter {
    qps: f64,
    burst: f64,
    /// Tokens left (negative: requests already promised a later slot) and when they were counted.
    state: Mutex<(f64, Instant)>,
}

impl Limiter {
    /// `qps <= 0` means no limit.
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Limiter {
            qps,
            burst,
            state: Mutex::new((burst, Instant::now())),
        }
    }

    /// Waits for this request's slot.
    pub async fn acquire(&self) {
        if self.qps <= 0.0 || !self.qps.is_finite() {
            return;
        }
        let wait = {
            let mut state = self.state.lock().await;
            let now = Instant::now();
            let refill = now.duration_since(state.1).as_secs_f64() * self.qps;
            let tokens = (state.0 + refill).min(self.burst) - 1.0;
            *state = (tokens, now);
            if tokens < 0.0 {
                Duration::from_secs_f64(-tokens / self.qps)
            } else {
                Duration::ZERO
            }
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn burst_then_rate() {
        let limiter = Limiter::new(100.0, 10);
        let start = Instant::now();
        for _ in 0..10 {
            limiter.acquire().await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO);
        for _ in 0..100 {
            limiter.acquire().await;
        }
        let elapsed = start.elapsed();
        assert!(elapsed >= Duration::from_millis(990), "{elapsed:?}");
    }
}

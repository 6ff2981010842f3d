//! A token bucket for the controller's API writes, like client-go's `--kube-api-qps` and
//! `--kube-api-burst`, so a burst of new nodes cannot flood the API server.

use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

#[derive(Debug)]
pub struct RateLimiter {
    qps: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl RateLimiter {
    /// `qps <= 0` means unlimited.
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        RateLimiter {
            qps,
            burst,
            state: Mutex::new((burst, Instant::now())),
        }
    }

    /// Waits until a request may go.
    pub async fn acquire(&self) {
        if self.qps <= 0.0 || !self.qps.is_finite() {
            return;
        }
        let wait = {
            let mut state = self.state.lock().await;
            let (tokens, last) = *state;
            let now = Instant::now();
            let tokens =
                (tokens + now.duration_since(last).as_secs_f64() * self.qps).min(self.burst) - 1.0;
            *state = (tokens, now);
            // A negative balance is a debt paid by waiting; later callers queue behind it.
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
    async fn burst_then_qps() {
        let rl = RateLimiter::new(10.0, 5);
        let start = Instant::now();
        for _ in 0..5 {
            rl.acquire().await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO, "the burst goes at once");
        for _ in 0..10 {
            rl.acquire().await;
        }
        // Ten more at 10/s need about a second of (paused, virtual) time.
        let t = start.elapsed();
        assert!(
            t >= Duration::from_millis(950) && t <= Duration::from_millis(1100),
            "{t:?}"
        );
    }

    #[tokio::test]
    async fn unlimited() {
        let rl = RateLimiter::new(0.0, 1);
        for _ in 0..1000 {
            rl.acquire().await;
        }
    }
}

//! The background index builder: one thread that catches the active
//! segments' in-memory indexes up and writes sealed segments' index files.

use super::*;

/// The background builder: one thread per engine, stopped (and joined)
/// when the engine closes.
#[derive(Debug)]
pub struct Builder {
    shared: Arc<(Mutex<bool>, Condvar)>,
    stopped: Arc<AtomicBool>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// How often an idle builder looks for new records.
const IDLE: Duration = Duration::from_millis(20);

impl Builder {
    /// Starts the thread. Each round it calls `step` (one round of
    /// [`StreamIndex::build_step`] over every stream; true when work
    /// remains, and it checks `stop` between streams); it sleeps while
    /// there is nothing to do.
    pub fn start(step: impl Fn(&AtomicBool) -> bool + Send + 'static) -> Result<Builder> {
        Builder::start_named("rheo-index", IDLE, step)
    }

    /// As [`Builder::start`], for any background job: a thread named
    /// `name` that calls `step` and, when it returns false, sleeps `idle`
    /// (or until woken).
    pub fn start_named(
        name: &str,
        idle: Duration,
        step: impl Fn(&AtomicBool) -> bool + Send + 'static,
    ) -> Result<Builder> {
        let shared = Arc::new((Mutex::new(false), Condvar::new()));
        let stopped = Arc::new(AtomicBool::new(false));
        let (s, stop) = (shared.clone(), stopped.clone());
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    if !step(&stop) {
                        let mut woken = s.0.lock();
                        if !*woken {
                            s.1.wait_for(&mut woken, idle);
                        }
                        *woken = false;
                    }
                }
            })
            .map_err(|e| Error::failed("open", format!("cannot start the {name} thread: {e}")))?;
        Ok(Builder { shared, stopped, thread: Mutex::new(Some(thread)) })
    }

    /// Wakes the builder (new work, e.g. an index was added).
    pub fn wake(&self) {
        *self.shared.0.lock() = true;
        self.shared.1.notify_one();
    }

    /// Stops and joins the thread (from the thread itself, which may hold
    /// the last handle on the engine: stops it without joining).
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.wake();
        if let Some(t) = self.thread.lock().take()
            && t.thread().id() != std::thread::current().id()
        {
            let _ = t.join();
        }
    }
}

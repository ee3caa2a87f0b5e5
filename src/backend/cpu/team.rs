//! A team of threads for the length of one forward step: the thread running the step hands
//! out the chunks of each kernel, and the helpers, which spin between kernels instead of
//! going to sleep, take them as soon as they are published.
//!
//! A decode step is a few hundred small kernels (a matrix × vector product is tens of
//! microseconds). Handing each to rayon on its own wakes idle threads for every kernel, and a
//! wake-up costs as much as the kernel: natively two threads then decode 1.6× faster than one,
//! and in the browser, where waking a Web Worker is slower still, no faster at all. A team
//! keeps its threads spinning for the whole step (as llama.cpp's thread pool does between
//! graph nodes) and they rest between steps.
//!
//! Each job's chunks are claimed through one atomic word holding the job's id, its chunk count
//! and the next chunk, so that a helper that saw an earlier job claims nothing of a later one.

use std::any::Any;
use std::cell::Cell;
use std::hint::spin_loop;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Bits of the claim word for the chunk count and for the next chunk; the job id has the rest.
const INDEX_BITS: u32 = 20;
/// The most chunks one job can have (larger jobs run on the calling thread).
pub const MAX_CHUNKS: usize = (1 << INDEX_BITS) - 1;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;

/// One kernel's work: `run(i)` for every chunk `i` below the count in the claim word.
struct Job<'a> {
    run: &'a (dyn Fn(usize) + Sync),
}

/// The threads of one step: the owner (the thread running the step) and its helpers.
pub struct Team {
    /// `id << 2·INDEX_BITS | count << INDEX_BITS | next`: the current job, its chunk count
    /// and the next chunk to claim.
    claim: AtomicU64,
    /// The current job, on the owner's stack; read only by a thread whose claim succeeded,
    /// which proves the job is not finished and the owner still waits for it.
    job: AtomicPtr<Job<'static>>,
    /// Chunks of the current job finished.
    done: AtomicUsize,
    /// Jobs published so far (the next job's id).
    jobs: AtomicU64,
    /// Set when the step ends: the helpers return.
    stop: AtomicBool,
    /// A panic of a chunk, passed on by the owner once every chunk has finished.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

thread_local! {
    /// The team whose owner is this thread, during a step.
    static OWNED: Cell<*const Team> = const { Cell::new(std::ptr::null()) };
}

const fn pack(id: u64, count: u64, next: u64) -> u64 {
    (id << (2 * INDEX_BITS)) | (count << INDEX_BITS) | next
}

impl Default for Team {
    fn default() -> Self {
        Self::new()
    }
}

impl Team {
    /// A team with no job yet.
    pub fn new() -> Self {
        Team {
            claim: AtomicU64::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            done: AtomicUsize::new(0),
            jobs: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            panic: Mutex::new(None),
        }
    }

    /// Claims and runs chunks of the job in `claim` until none is left or the job changes;
    /// returns whether it ran any.
    fn work(&self) -> bool {
        let mut ran = false;
        loop {
            let s = self.claim.load(Ordering::Acquire);
            let count = (s >> INDEX_BITS) & INDEX_MASK;
            let next = s & INDEX_MASK;
            if next >= count {
                return ran;
            }
            // Read before the claim: if the claim succeeds, the job was unfinished then and
            // so already published here and still alive (its owner waits for this chunk).
            let job = self.job.load(Ordering::Acquire);
            if self
                .claim
                .compare_exchange_weak(s, s + 1, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue;
            }
            // SAFETY: the claim of chunk `next` of this job succeeded, so the job is not
            // finished: its owner is inside `run_job` waiting for this chunk, and `job` points
            // to its `Job`, which outlives that wait.
            let run = unsafe { (*job).run };
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| run(next as usize))) {
                if let Ok(mut slot) = self.panic.lock() {
                    slot.get_or_insert(p);
                }
            }
            self.done.fetch_add(1, Ordering::Release);
            ran = true;
        }
    }

    /// A helper's loop: takes chunks as jobs appear, spinning in between, until the owner's
    /// [`Team::lead`] returns.
    pub fn help(&self) {
        loop {
            if !self.work() {
                if self.stop.load(Ordering::Acquire) {
                    return;
                }
                spin_loop();
            }
        }
    }

    /// Runs `f(i)` for `i` in `0..count` on the team (the owner takes chunks too) and returns
    /// once all have finished.
    fn run_job(&self, count: usize, f: &(dyn Fn(usize) + Sync)) {
        let id =
            (self.jobs.fetch_add(1, Ordering::Relaxed) + 1) & ((1 << (64 - 2 * INDEX_BITS)) - 1);
        let job = Job { run: f };
        // The pointer is read only by a thread holding an unfinished chunk of this job, and
        // this function returns only once every chunk has finished.
        let ptr = &job as *const Job<'_> as *mut Job<'static>;
        self.done.store(0, Ordering::Relaxed);
        self.job.store(ptr, Ordering::Release);
        self.claim
            .store(pack(id, count as u64, 0), Ordering::Release);
        self.work();
        while self.done.load(Ordering::Acquire) < count {
            spin_loop();
        }
        let panic = self.panic.lock().ok().and_then(|mut p| p.take());
        if let Some(p) = panic {
            resume_unwind(p);
        }
    }

    /// Runs `f` on this thread as the team's owner: kernels inside it that call [`split`]
    /// share their chunks with the helpers running [`Team::help`], which return when `f` has.
    pub fn lead<R>(&self, f: impl FnOnce() -> R) -> R {
        struct Owner<'a>(&'a Team, *const Team);
        impl Drop for Owner<'_> {
            fn drop(&mut self) {
                OWNED.with(|o| o.set(self.1));
                self.0.stop.store(true, Ordering::Release);
            }
        }
        let before = OWNED.with(|o| o.replace(self));
        let _owner = Owner(self, before);
        f()
    }
}

/// Runs `f` (a forward step) on the current rayon pool (the global one outside any pool) as
/// the owner of a team of `threads` threads: the owner and `threads − 1` helpers; the caller
/// waits for it.
pub fn run_step<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    let team = Team::new();
    rayon::scope(|s| {
        for _ in 1..threads {
            s.spawn(|_| team.help());
        }
        team.lead(f)
    })
}

/// Whether this thread leads a team (it is inside [`Team::lead`]).
pub fn leading() -> bool {
    !OWNED.with(Cell::get).is_null()
}

/// Runs `f(i)` for every `i` in `0..count` on the team this thread leads and returns `true`;
/// returns `false` without running anything when it leads none (or the count does not fit a
/// claim word, or there is one chunk), so that the caller runs the work itself.
pub fn split(count: usize, f: &(dyn Fn(usize) + Sync)) -> bool {
    let team = OWNED.with(Cell::get);
    if team.is_null() || !(2..=MAX_CHUNKS).contains(&count) {
        return false;
    }
    // While the job runs, this thread leads no team: a kernel called from one of its chunks
    // runs on this thread instead of publishing a job over the one in flight.
    OWNED.with(|o| o.set(std::ptr::null()));
    struct Restore(*const Team);
    impl Drop for Restore {
        fn drop(&mut self) {
            OWNED.with(|o| o.set(self.0));
        }
    }
    let _restore = Restore(team);
    // SAFETY: `team` is the team whose `lead` is running on this thread, which outlives this.
    unsafe { (*team).run_job(count, f) };
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    /// `jobs` jobs of varied chunk counts on a team of `helpers` helper threads: every chunk
    /// of every job runs exactly once, and before its job returns.
    fn run_jobs(helpers: usize, jobs: usize) {
        let team = Team::new();
        std::thread::scope(|s| {
            for _ in 0..helpers {
                s.spawn(|| team.help());
            }
            team.lead(|| {
                for j in 0..jobs {
                    let count = 1 + (j * 7919) % 97;
                    let hits: Vec<AtomicU32> = (0..count).map(|_| AtomicU32::new(0)).collect();
                    let f = |i: usize| {
                        hits[i].fetch_add(1, Ordering::Relaxed);
                    };
                    if !split(count, &f) {
                        (0..count).for_each(f);
                    }
                    for (i, h) in hits.iter().enumerate() {
                        assert_eq!(
                            h.load(Ordering::Relaxed),
                            1,
                            "job {j}, chunk {i} of {count}"
                        );
                    }
                }
            });
        });
    }

    #[test]
    fn every_chunk_runs_once_on_teams_of_every_size() {
        for helpers in [0, 1, 3, 7] {
            run_jobs(helpers, 3000);
        }
    }

    #[test]
    fn a_kernel_inside_a_chunk_runs_on_its_thread() {
        let team = Team::new();
        let total = AtomicU32::new(0);
        std::thread::scope(|s| {
            s.spawn(|| team.help());
            team.lead(|| {
                let outer = |_: usize| {
                    let inner = |_: usize| {
                        total.fetch_add(1, Ordering::Relaxed);
                    };
                    // Only the owner leads; on the owner the job in flight is not replaced.
                    if !split(5, &inner) {
                        (0..5).for_each(inner);
                    }
                };
                assert!(split(16, &outer));
            });
        });
        assert_eq!(total.load(Ordering::Relaxed), 80);
        assert!(!leading());
    }

    #[test]
    fn a_panicking_chunk_reaches_the_owner_after_the_others_finish() {
        let team = Team::new();
        let finished = AtomicU32::new(0);
        let caught = std::thread::scope(|s| {
            s.spawn(|| team.help());
            catch_unwind(AssertUnwindSafe(|| {
                team.lead(|| {
                    let f = |i: usize| {
                        if i == 13 {
                            panic!("chunk 13");
                        }
                        finished.fetch_add(1, Ordering::Relaxed);
                    };
                    split(64, &f);
                })
            }))
        });
        let message = caught
            .err()
            .and_then(|p| p.downcast_ref::<&str>().map(|s| s.to_string()));
        assert_eq!(message.as_deref(), Some("chunk 13"));
        assert_eq!(finished.load(Ordering::Relaxed), 63);
        assert!(!leading(), "the owner's team is gone after the panic");
    }

    #[test]
    fn without_a_team_split_runs_nothing() {
        let ran = AtomicU32::new(0);
        let f = |_: usize| {
            ran.fetch_add(1, Ordering::Relaxed);
        };
        assert!(!split(10, &f));
        assert_eq!(ran.load(Ordering::Relaxed), 0);
    }
}

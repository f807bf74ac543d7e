//! The one way stagefs takes a lock: a thread that panicked while holding a lock
//! leaves it poisoned, and every lock here guards books that stay consistent at each
//! step (a panic is reported where it happens), so a poisoned lock is taken as it is
//! rather than spreading the panic to every later caller.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

/// `m`, locked, whether or not a panicking thread poisoned it.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// [`Condvar::wait`] on `guard`, poison or not.
pub fn wait<'a, T>(changed: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    changed.wait(guard).unwrap_or_else(PoisonError::into_inner)
}

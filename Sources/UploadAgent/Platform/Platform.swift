#if canImport(Glibc)
import Glibc
#endif
import FoundationEssentials
import UploadPlatform

/// The agent's calls into the operating system that Swift's standard library and FoundationEssentials do not make:
/// standard error, a shell command, a thread of its own, a file's type. Linux (glibc) is what is built and tested;
/// inotify (``DirectoryWatcher``) and `O_DIRECT` are Linux's alone.
package enum Platform {
    /// Writes `text` to standard error, whole (short writes and EINTR retried); a closed stderr loses it silently.
    package static func writeStandardError(_ text: String) {
        Self.writeWhole(text, to: 2)
    }

    /// Writes `text` to standard output, whole. Not through `print`'s buffer: what is written is out at once.
    package static func writeStandardOutput(_ text: String) {
        Self.writeWhole(text, to: 1)
    }

    private static func writeWhole(_ text: String, to descriptor: Int32) {
        var bytes = Array(text.utf8)
        bytes.withUnsafeMutableBytes { buffer in
            var offset = 0
            while offset < buffer.count {
                let written = write(descriptor, buffer.baseAddress.map { $0 + offset }, buffer.count - offset)
                if written > 0 {
                    offset += written
                } else if written < 0 && errno == EINTR {
                    continue
                } else {
                    return
                }
            }
        }
    }

    /// Runs `/bin/sh -c command` apart from the agent (``IsolatedCommand``: its own session, default signals, the base
    /// environment only, never the agent's token) and waits for it, at most `timeout`: its exit status, or a signal's
    /// number plus 128, as a shell reports it. Throws when it cannot start or ran out of time.
    package static func runShell(_ command: String, timeout: Duration = .seconds(60)) throws -> Int32 {
        let environment = IsolatedCommand.environment(ProcessInfo.processInfo.environment)
        let ended = IsolatedCommand(command: command, environment: environment, timeout: timeout).run()
        if case .couldNotStart(let reason) = ended.outcome { throw SourceError("cannot run /bin/sh: \(reason)") }
        if ended.timedOut { throw SourceError("it ran longer than \(timeout) and was killed") }
        return ended.shellStatus
    }

    /// Starts `body` on a thread of its own (a blocking loop that must not hold a pool's thread), detached.
    package static func startThread(_ body: @escaping @Sendable () -> Void) throws {
        final class Box {
            let body: @Sendable () -> Void
            init(_ body: @escaping @Sendable () -> Void) { self.body = body }
        }
        let box = Unmanaged.passRetained(Box(body)).toOpaque()
        var thread = pthread_t()
        let created = pthread_create(
            &thread, nil,
            { context in
                guard let context else { return nil }
                let box = Unmanaged<Box>.fromOpaque(context).takeRetainedValue()
                box.body()
                return nil
            }, box)
        guard created == 0 else {
            Unmanaged<Box>.fromOpaque(box).release()
            throw SourceError("cannot start a thread: \(String(cString: strerror(created)))")
        }
        pthread_detach(thread)
    }

    /// Whether `path` is a directory (a symbolic link to one counts, as the shell's `test -d`).
    package static func isDirectory(_ path: String) -> Bool {
        var info = stat()
        return stat(path, &info) == 0 && (info.st_mode & S_IFMT) == S_IFDIR
    }

    /// Whether anything is at `path` (a dangling symbolic link counts).
    package static func exists(_ path: String) -> Bool {
        var info = stat()
        return lstat(path, &info) == 0
    }

    /// Seconds since 1970, as a Double (the state database's timestamps).
    package static func unixTime() -> Double {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        return Double(now.tv_sec) + Double(now.tv_nsec) / 1e9
    }
}

extension StringProtocol {
    /// Without leading and trailing white space (spaces, tabs, new lines).
    package var trimmed: String {
        let isSpace: (Character) -> Bool = { $0.isWhitespace }
        guard let first = self.firstIndex(where: { !isSpace($0) }), let last = self.lastIndex(where: { !isSpace($0) }) else { return "" }
        return String(self[first...last])
    }
}

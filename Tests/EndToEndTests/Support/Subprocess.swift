import Foundation
import UploadTestSupport

/// The package's root, found from this file.
let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent().deletingLastPathComponent().path

/// A child process (the relay binary, the fault proxy) that writes host:port to a ready file.
final class ChildProcess: @unchecked Sendable {
    let process = Process()
    let readyFile: String
    let logFile: String

    init(_ executable: String, _ arguments: [String], readyFile: String, logFile: String, environment: [String: String]? = nil) throws {
        self.readyFile = readyFile
        self.logFile = logFile
        try? FileManager.default.removeItem(atPath: readyFile)
        guard FileManager.default.createFile(atPath: logFile, contents: nil) else {
            throw TestSetupError(description: "cannot create the child's log file \(logFile)")
        }
        self.process.executableURL = URL(fileURLWithPath: executable)
        self.process.arguments = arguments
        if let environment { self.process.environment = environment }
        let log = FileHandle(forWritingAtPath: logFile)!
        log.seekToEndOfFile()
        self.process.standardOutput = log
        self.process.standardError = log
        try self.process.run()
    }

    deinit {
        // A test that failed half-way still ends what it started.
        if self.process.isRunning {
            Foundation.kill(self.process.processIdentifier, SIGKILL)
            self.process.waitUntilExit()
        }
    }

    /// Waits for the ready file (the child is listening) and returns its port.
    func waitUntilReady(timeout: TimeInterval = 30) async throws -> Int {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if let text = try? String(contentsOfFile: self.readyFile, encoding: .utf8),
                let port = text.split(separator: ":").last.flatMap({ Int($0.trimmingCharacters(in: .whitespacesAndNewlines)) })
            {
                return port
            }
            guard self.process.isRunning else { break }
            try await Task.sleep(for: .milliseconds(20))
        }
        let log = (try? String(contentsOfFile: self.logFile, encoding: .utf8)) ?? ""
        throw ChildError(description: "\(self.process.executableURL!.lastPathComponent) did not get ready: \(log)")
    }

    func kill(_ signal: Int32) {
        Foundation.kill(self.process.processIdentifier, signal)
    }

    /// For a child told to stop (it exits at once, or within its grace): a short wait, also from `defer`.
    func waitForExit() -> Int32 {
        self.process.waitUntilExit()
        return self.process.terminationStatus
    }

    /// Waits for the child to end on its own (an upload to finish, a relay to drain), on a thread of its own.
    func exited() async -> Int32 {
        let process = self.process
        return
            (try? await onThreadOfItsOwn {
                process.waitUntilExit()
                return process.terminationStatus
            }) ?? -1
    }

    var log: String { (try? String(contentsOfFile: self.logFile, encoding: .utf8)) ?? "" }

    struct ChildError: Error, CustomStringConvertible {
        var description: String
    }
}

/// The relay binary built next to the tests.
func relayBinary() throws -> String {
    let path = packageRoot + "/.build/debug/upload-relay"
    guard FileManager.default.isExecutableFile(atPath: path) else {
        throw ChildProcess.ChildError(description: "\(path) is missing: run `swift build` before the tests (tools/test does)")
    }
    return path
}

/// The fault-injecting proxy of tools/ in front of `target`.
func startProxy(target: Int, directory: String, _ faults: [String]) async throws -> (ChildProcess, Int) {
    let proxy = try ChildProcess(
        "/usr/bin/env",
        [
            "python3", packageRoot + "/tools/faultproxy.py", "--listen", "127.0.0.1:0", "--target", "127.0.0.1:\(target)",
            "--ready-file", directory + "/proxy.ready", "--log", directory + "/proxy.log",
        ] + faults,
        readyFile: directory + "/proxy.ready", logFile: directory + "/proxy.out"
    )
    return await (proxy, try proxy.waitUntilReady())
}

import Foundation
import UploadAgent
import UploadTestSupport

/// The agent binary run as a user runs it (`watch`, `send`), against a ``TestRelay``, with its own state directory.
/// Its stdout and stderr go to one log; JSON lines are its `--json` events.
final class AgentProcess: @unchecked Sendable {
    let child: ChildProcess

    /// The environment that points an agent at `relay` (through `port` when a proxy stands between them).
    static func environment(_ relay: TestRelay, port: Int? = nil, state: String) -> [String: String] {
        ["UPLOAD_RELAY": "127.0.0.1:\(port ?? relay.port)", "UPLOAD_CA": relay.caPath, "UPLOAD_TOKEN": relay.token, "XDG_STATE_HOME": state]
    }

    init(_ arguments: [String], environment: [String: String], log: String) throws {
        var env = ProcessInfo.processInfo.environment
        env.merge(environment) { $1 }
        self.child = try ChildProcess(try CommandLineTests.agentBinary(), arguments, readyFile: log + ".unused", logFile: log, environment: env)
    }

    /// The JSON objects printed so far.
    var events: [[String: Any]] {
        self.child.log.split(separator: "\n").compactMap { line in
            guard line.hasPrefix("{") else { return nil }
            return (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any]
        }
    }

    func finished(_ key: String) -> [String: Any]? {
        self.events.first { $0["event"] as? String == "finished" && $0["key"] as? String == key }
    }

    func started(_ key: String) -> Int {
        self.events.filter { $0["event"] as? String == "started" && $0["key"] as? String == key }.count
    }

    /// Waits until `condition` holds, looking every 20 ms, for at most `timeout` seconds; false when it never did.
    @discardableResult
    static func waitUntil(timeout: Double = 30, _ condition: () throws -> Bool) async rethrows -> Bool {
        try await Polling.waitUntil(timeout: timeout) { () async throws -> Bool in try condition() }
    }

    /// Ends the agent: SIGTERM (a clean stop) or SIGKILL; returns its exit status.
    @discardableResult
    func stop(_ signal: Int32 = SIGTERM) -> Int32 {
        self.child.kill(signal)
        return self.child.waitForExit()
    }
}

import Foundation
import Logging
import PostgresNIO
import UploadRelay
import UploadRelayPostgres

/// A database of its own in the run's PostgreSQL (tools/test starts a throwaway cluster and exports
/// `UPLOAD_TEST_POSTGRES_URL`), collated in English, dropped after use.
public enum PostgresTestDatabase {
    public static let missing = """
        UPLOAD_TEST_POSTGRES_URL is not set: these tests need a real PostgreSQL. Run tools/test, which starts one, or: \
        eval "$(tools/pg/postgres.sh start /tmp/pg)" (and tools/pg/postgres.sh stop /tmp/pg after)
        """

    public static var quietLogger: Logger {
        var logger = Logger(label: "postgres-test")
        logger.logLevel = .critical
        return logger
    }

    /// Makes a new, empty database; returns its URL and what drops it (its connections cut).
    public static func make() async throws -> (url: String, drop: @Sendable () async -> Void) {
        guard let base = ProcessInfo.processInfo.environment["UPLOAD_TEST_POSTGRES_URL"] else {
            throw TestSetupError(description: Self.missing)
        }
        guard let range = base.range(of: "/upload?") else {
            throw TestSetupError(description: "UPLOAD_TEST_POSTGRES_URL names no database \"upload\" (.../upload?...): \(base)")
        }
        let name = "t_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").prefix(16).lowercased()
        let admin = try await PostgresCatalog(url: base, logger: Self.quietLogger)
        do {
            // An ICU English collation, as production databases often have, rather than the cluster's C.UTF-8: no query
            // may rely on text ordering as bytes unless it says COLLATE "C".
            try await admin.execute("CREATE DATABASE \(name) TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'")
        } catch {
            admin.shutdown()
            throw error
        }
        let drop: @Sendable () async -> Void = {
            try? await admin.execute("DROP DATABASE \(name) WITH (FORCE)")
            admin.shutdown()
        }
        return (base.replacingCharacters(in: range, with: "/\(name)?"), drop)
    }

    /// Runs `body` with the URL of a new, empty database, then drops it, whether `body` threw or not.
    public static func with<T>(_ body: (String) async throws -> T) async throws -> T {
        let (url, drop) = try await Self.make()
        do {
            let value = try await body(url)
            await drop()
            return value
        } catch {
            await drop()
            throw error
        }
    }
}

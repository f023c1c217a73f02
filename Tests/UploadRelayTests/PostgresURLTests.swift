import Foundation
import Logging
import NIOSSL
import PostgresNIO
import Testing
import UploadTestSupport

@testable import UploadRelay
@testable import UploadRelayPostgres

/// `--catalog postgres://...?sslmode=`: libpq's six values and nothing else, `sslrootcert` for a private CA, and a
/// failed login or TLS handshake said as what it is. The live tests run against the run's PostgreSQL, which takes TLS
/// with a certificate from its own CA (tools/pg/postgres.sh).
@Suite("Catalog URL: sslmode, sslrootcert, and connection failures")
struct PostgresURLTests {
    static func url(_ query: String, password: String? = nil) throws -> String {
        let base = try #require(ProcessInfo.processInfo.environment["UPLOAD_TEST_POSTGRES_URL"], "\(PostgresTestDatabase.missing)")
        var components = try #require(URLComponents(string: base))
        components.query = query.isEmpty ? nil : query
        if let password { components.password = password }
        return try #require(components.string)
    }

    static func ca() throws -> String {
        try #require(ProcessInfo.processInfo.environment["UPLOAD_TEST_POSTGRES_CA"], "tools/pg/postgres.sh exports UPLOAD_TEST_POSTGRES_CA")
    }

    @Test("libpq's six sslmode values are taken, any other value or parameter is refused with what is allowed; each mode's TLS settings")
    func modes() async throws {
        let base = "postgres://u:p@db.example:5432/upload"
        let ca = try Self.ca()
        for mode in ["disable", "allow", "prefer", "require", "verify-ca", "verify-full"] {
            #expect(try PostgresCatalog.Address(base + "?sslmode=" + mode + "&sslrootcert=" + ca).tlsMode.rawValue == mode)
        }
        // As libpq: the verifying modes need the CA named; the system's CAs only with the host name checked.
        #expect(throws: CatalogError.self) { try PostgresCatalog.Address(base + "?sslmode=verify-ca") }
        #expect(throws: CatalogError.self) { try PostgresCatalog.Address(base + "?sslmode=verify-full") }
        #expect(throws: CatalogError.self) { try PostgresCatalog.Address(base + "?sslmode=verify-ca&sslrootcert=system") }
        #expect(throws: CatalogError.self) { try PostgresCatalog.Address(base + "?sslmode=require&sslrootcert=system") }
        #expect(try PostgresCatalog.Address(base).tlsMode == .prefer)
        for wrong in ["?sslmode=requre", "?sslmode=verify_ca", "?sslmode=REQUIRE", "?sslmode=", "?ssl=true", "?sslmode=require&sslmode=disable"] {
            #expect(throws: CatalogError.self, "\(wrong)") { try PostgresCatalog.Address(base + wrong) }
        }
        do {
            _ = try PostgresCatalog.Address(base + "?sslmode=requre")
        } catch let error as CatalogError {
            #expect(error.description.contains("verify-full") && error.description.contains("requre"), "\(error)")
        }
        #expect(throws: CatalogError.self) { try PostgresCatalog.Address(base + "?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem") }
        // The password never shows in a message about the URL.
        do {
            _ = try PostgresCatalog.Address("postgres://u:secret@/nohost")
        } catch let error as CatalogError {
            #expect(!error.description.contains("secret"), "\(error)")
        }

        #expect(try PostgresCatalog.Address(base + "?sslmode=disable").tlsConfiguration() == nil)
        #expect(try PostgresCatalog.Address(base + "?sslmode=require").tlsConfiguration()?.certificateVerification == CertificateVerification.none)
        #expect(
            try PostgresCatalog.Address(base + "?sslmode=verify-ca&sslrootcert=" + ca).tlsConfiguration()?.certificateVerification
                == .noHostnameVerification)
        #expect(
            try PostgresCatalog.Address(base + "?sslmode=verify-full&sslrootcert=system").tlsConfiguration()?.certificateVerification
                == .fullVerification)
        #expect(
            try PostgresCatalog.Address(base + "?sslmode=require&sslrootcert=" + ca).tlsConfiguration()?.certificateVerification
                == .noHostnameVerification)
        #expect(try PostgresCatalog.Address(base + "?sslmode=verify-full&sslrootcert=system").rootCertificates == nil)
    }

    /// Whether the catalog's pooled connection runs over TLS, by the server's own account.
    static func usesTLS(_ catalog: PostgresCatalog) async throws -> Bool {
        let logger = PostgresTestDatabase.quietLogger
        return try await catalog.run { connection in
            let rows = try await connection.query("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", logger: logger).collect()
            return try rows.first?.makeRandomAccess()["ssl"].decode(Bool.self) ?? false
        }
    }

    @Test(
        "against a server with TLS: disable is plain text; allow, prefer, require, verify-ca and verify-full (with its CA) are TLS, never a silent downgrade"
    )
    func liveModes() async throws {
        let ca = try Self.ca()
        for (query, tls) in [
            ("sslmode=disable", false), ("sslmode=allow", true), ("sslmode=prefer", true), ("", true), ("sslmode=require", true),
            ("sslmode=verify-ca&sslrootcert=" + ca, true), ("sslmode=verify-full&sslrootcert=" + ca, true),
        ] {
            let catalog = try await PostgresCatalog(url: try Self.url(query), logger: PostgresTestDatabase.quietLogger)
            defer { catalog.shutdown() }
            await #expect(try Self.usesTLS(catalog) == tls, "\(query)")
        }
    }

    @Test("a certificate that does not verify, a wrong password: said as such at once, not as a database that did not answer")
    func failures() async throws {
        let started = Date()
        // The server's certificate is signed by the test CA, which the system does not trust.
        do {
            let catalog = try await PostgresCatalog(
                url: try Self.url("sslmode=verify-full&sslrootcert=system"), logger: PostgresTestDatabase.quietLogger, timeout: .seconds(60))
            catalog.shutdown()
            Issue.record("verify-full connected with a certificate from a CA the system does not trust")
        } catch let error as CatalogError {
            #expect(error.description.contains("TLS") && !error.description.contains("did not answer"), "\(error)")
        }
        do {
            let catalog = try await PostgresCatalog(
                url: try Self.url("sslmode=disable", password: "wrong"), logger: PostgresTestDatabase.quietLogger, timeout: .seconds(60))
            catalog.shutdown()
            Issue.record("a wrong password connected")
        } catch let error as CatalogError {
            #expect(error.description.contains("refused the login") && error.description.contains("upload"), "\(error)")
            #expect(!error.description.contains("wrong"), "the message shows the password: \(error)")
        }
        // Said at once, not after the 60 s deadline (the bound leaves room for a loaded machine).
        #expect(Date().timeIntervalSince(started) < 30, "the failures took \(Date().timeIntervalSince(started)) s to be said")
    }
}

import Logging
import NIOCore
import UploadProtocol

/// A connection's blocking work, run on the I/O thread pool, each answer delivered on the connection's event loop:
/// the catalog lookup of a credential, and the lookup of an OPEN (with, for an upload, the executor of its storage).
struct RelayWork {
    let services: RelayServices
    let eventLoop: any EventLoop

    /// The account the HELLO's token names, if any.
    func authenticate(_ hello: Frame.Hello, then answer: @escaping (Result<Account?, any Error>) -> Void) {
        let (catalog, hash) = (self.services.catalog, Tokens.hash(hello.credential))
        self.services.threadPool.runIfActive(eventLoop: self.eventLoop) {
            try catalog.account(tokenHash: hash)
        }.assumeIsolated().whenComplete(answer)
    }

    /// The relay's answer to OPEN by ``UploadPolicy``; for an upload, the executor that will run its storage steps
    /// (it holds the staging file and the SHA-1 state, which the session never sees).
    func lookUp(
        _ open: Frame.Open, _ key: ObjectKey, _ account: Account, logger: Logger,
        then answer: @escaping (RelaySession.LookUp, UploadExecutor?) -> Void
    ) {
        let (services, eventLoop) = (self.services, self.eventLoop)
        let policy = UploadPolicy(services: services)
        services.threadPool.runIfActive(eventLoop: eventLoop) {
            policy.open(account: account, open: open, key: key)
        }.assumeIsolated().whenComplete { result in
            switch result {
            case .success(.stored(let size)):
                answer(.stored(size: size), nil)
            case .success(.refuse(let code, let message)):
                answer(.refuse(code, message), nil)
            case .success(.upload(let session, let staging, let sha1, let resumed, let byteLimit)):
                let executor = UploadExecutor(
                    id: open.streamID, key: key, account: account.name, overwrite: open.overwrite, session: session,
                    staging: staging, sha1: sha1, services: services, eventLoop: eventLoop, logger: logger
                )
                let decision = RelaySession.LookUp.upload(
                    durableOffset: session.durableOffset, resumeToken: session.resumeToken, resumed: resumed, byteLimit: byteLimit
                )
                answer(decision, executor)
            case .failure(let error):
                answer(.refuse(.internalError, "relay failed to open the upload: \(error)"), nil)
            }
        }
    }
}
